package pool

import (
	"context"
	"errors"
	"sync"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// Decider is what the pool needs of the log to deny, when their
// approvalTimeout expires, the requests of a waiting submission: *log.DB
// is one. A pool whose Log is not (a remote worker's) runs no approval
// timers; the log owner does.
type Decider interface {
	Decide(ctx context.Context, d clog.Decide) (clog.Decided, bool, error)
}

// timeoutPrincipal is who denies a request when its deadline passes.
var timeoutPrincipal = record.Principal{Subject: "convlog:timeout"}

// approvalTimers are the pool's timers of waiting submissions with an
// ApprovalDeadline, by submission id.
type approvalTimers struct {
	mu      sync.Mutex
	timers  map[string]*time.Timer
	stopped bool
}

// armApproval makes sure a timer denies sub's undecided requests at its
// ApprovalDeadline (at once if it has passed). It is called when a turn
// starts waiting and by every recovery scan and sweep, so that a deadline
// outlives the process that set it.
func (p *Pool) armApproval(sub record.Submission) {
	d, ok := p.cfg.Log.(Decider)
	if !ok || !sub.Waiting() || sub.ApprovalDeadline.IsZero() {
		return
	}
	at := &p.approvals
	at.mu.Lock()
	defer at.mu.Unlock()
	if at.stopped || at.timers[sub.ID] != nil {
		return
	}
	if at.timers == nil {
		at.timers = map[string]*time.Timer{}
	}
	id := sub.ID
	at.timers[id] = time.AfterFunc(time.Until(sub.ApprovalDeadline), func() {
		p.expireApproval(d, id)
		at.mu.Lock()
		delete(at.timers, id)
		at.mu.Unlock()
	})
}

// stopApprovals stops the timers: the next start's recovery re-arms them.
func (p *Pool) stopApprovals() {
	at := &p.approvals
	at.mu.Lock()
	defer at.mu.Unlock()
	at.stopped = true
	for id, t := range at.timers {
		t.Stop()
		delete(at.timers, id)
	}
}

// expireApproval denies, reason "timeout", what is still undecided of a
// waiting submission, and dispatches its session when that resumes it. A
// person's decision that comes first stands: the log checks in the same
// transaction (ErrAlreadyDecided, ErrNotWaiting), and what is left of the
// requests is read again.
func (p *Pool) expireApproval(d Decider, id string) {
	ctx := p.turnsCtx
	for range 3 {
		sub, err := p.cfg.Log.Submission(ctx, id)
		if err != nil || !sub.Waiting() {
			return // settled, resumed or purged meanwhile
		}
		dec := clog.Decide{Key: sub.Key, SubmissionID: id}
		for _, r := range sub.Pending {
			who := timeoutPrincipal
			dec.Decisions = append(dec.Decisions, record.ApprovalDecisionPayload{
				ApprovalID: r.ApprovalID, Approved: false, Reason: record.ReasonTimeout, Principal: &who,
			})
		}
		res, _, err := d.Decide(ctx, dec)
		switch {
		case err == nil:
			if res.Resumed {
				p.dispatch(sub.Key)
			}
			return
		case errors.Is(err, clog.ErrAlreadyDecided):
			continue // someone decided some meanwhile: deny the rest
		case errors.Is(err, clog.ErrNotWaiting), errors.Is(err, clog.ErrSubmissionNotFound), ctx.Err() != nil:
			return
		default:
			p.logger.Error("worker: deny expired approval requests", "submission", id, "err", err)
			return
		}
	}
}
