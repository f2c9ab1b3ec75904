package pool

import (
	"context"
	"errors"
	"fmt"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/natsbus"
)

// Fence is what a turn's write is fenced by when the log is another
// process's: the session lease its writer holds, and the write's place in
// the turn. The log's owner refuses the write unless the lease still names
// the writer, and recognises a retried step, so that a write retried after
// a lost reply is never stored twice.
type Fence struct {
	Lease string // the holder's name in the lease bucket (natsbus.Lease.Owner)
	Step  uint64 // 1, 2, ... within Write.TurnID; 0 for a sweep's settlements
}

// FencedLog is a Log that takes fenced writes (worker/remote's client).
// The pool writes through it when the Log is one; a local *log.DB needs
// no fence, its file lock and the leases keep one writer per session.
type FencedLog interface {
	WriteFenced(ctx context.Context, w clog.Write, f Fence) (clog.Appended, error)
}

// write commits w, fenced by ls when the log is remote.
func (p *Pool) write(ctx context.Context, ls *natsbus.Lease, step uint64, w clog.Write) (clog.Appended, error) {
	if fl, ok := p.cfg.Log.(FencedLog); ok && ls != nil {
		return fl.WriteFenced(ctx, w, Fence{Lease: ls.Owner(), Step: step})
	}
	return p.cfg.Log.Write(ctx, w)
}

// write commits one step of the turn.
func (t *turn) write(ctx context.Context, w clog.Write) (clog.Appended, error) {
	if t.deltas != nil {
		t.deltas.flush() // the deltas before the records that hold them
	}
	t.step++
	return t.p.write(ctx, t.lease, t.step, w)
}

// AbortHere cancels a submission's turn if it runs in this pool, and waits
// (within ctx) for it to settle; ok is false when it does not run here.
// Remote workers answer the log owner's aborts with it.
func (p *Pool) AbortHere(ctx context.Context, id string) (sub record.Submission, ok bool, err error) {
	p.mu.Lock()
	ts := p.running[id]
	p.mu.Unlock()
	if ts == nil {
		// Its start may be committed and its turn not registered yet: the
		// starting runner holds the session's stripe until it is.
		sub, err := p.cfg.Log.Submission(ctx, id)
		if err != nil || sub.Status != record.StatusRunning {
			return record.Submission{}, false, nil
		}
		lk := p.stripe(sub.Key)
		lk.Lock()
		p.mu.Lock()
		ts = p.running[id]
		p.mu.Unlock()
		lk.Unlock()
		if ts == nil {
			return record.Submission{}, false, nil
		}
	}
	ts.cancel(errAborted)
	select {
	case <-ts.done:
	case <-ctx.Done():
	}
	sub, err = p.cfg.Log.Submission(context.WithoutCancel(ctx), id)
	return sub, true, err
}

// settleHeldOrphans settles interrupted the running submissions among
// pending that no turn of this pool runs, under the session lease ls that
// this pool holds (so their holder is gone).
func (p *Pool) settleHeldOrphans(ctx context.Context, key record.Key, ls *natsbus.Lease, pending []record.Submission) error {
	var w clog.Write
	p.mu.Lock()
	for _, s := range pending {
		if s.Status == record.StatusRunning && p.running[s.ID] == nil && len(w.Settle) < maxTurnSubmissions {
			f := interruptedFailure
			w.Settle = append(w.Settle, record.Settlement{SubmissionID: s.ID, Outcome: record.OutcomeFailed, Error: &f})
		}
	}
	p.mu.Unlock()
	if len(w.Settle) == 0 {
		return nil
	}
	w.Key = key
	_, err := p.write(ctx, ls, 0, w)
	switch {
	case errors.Is(err, clog.ErrSubmissionSettled), errors.Is(err, clog.ErrSubmissionState):
		return nil // settled meanwhile
	case err != nil:
		return fmt.Errorf("settle a dead holder's turn: %w", err)
	}
	p.logger.Warn("worker: settled interrupted submissions of a dead lease holder", "session", key.String(), "count", len(w.Settle))
	return nil
}
