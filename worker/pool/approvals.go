package pool

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// Decider is what approval timers need of the log: *log.DB is one. A pool
// whose Log is not one (a remote worker's) runs no approval timers; the
// log owner (worker/remote.Server) does.
type Decider interface {
	Submission(ctx context.Context, id string) (record.Submission, error)
	Decide(ctx context.Context, d clog.Decide) (clog.Decided, bool, error)
}

// timeoutPrincipal is who denies a request when its deadline passes.
var timeoutPrincipal = record.Principal{Subject: "convlog:timeout"}

// ApprovalTimers deny, when a waiting submission's ApprovalDeadline
// passes, its undecided requests (reason "timeout", principal
// "convlog:timeout"), by log.DB.Decide. A person's decision that comes
// first stands: the log checks both in its single committer. Only the
// process that owns the log runs them; Arm is called when a submission
// starts waiting and by every recovery scan and sweep, so that a deadline
// outlives the process that set it.
type ApprovalTimers struct {
	ctx     context.Context
	log     Decider
	logger  *slog.Logger
	resumed func(record.Key) // called when a timeout resumed a submission

	mu      sync.Mutex
	timers  map[string]*time.Timer
	stopped bool
}

// NewApprovalTimers makes timers that decide in log, within ctx, and call
// resumed (which may be nil) for the session of a submission they resumed.
func NewApprovalTimers(ctx context.Context, log Decider, logger *slog.Logger, resumed func(record.Key)) *ApprovalTimers {
	if logger == nil {
		logger = slog.Default()
	}
	return &ApprovalTimers{ctx: ctx, log: log, logger: logger, resumed: resumed, timers: map[string]*time.Timer{}}
}

// Arm makes sure a timer denies sub's undecided requests at its
// ApprovalDeadline (at once if it has passed). A submission not waiting,
// or without a deadline, or armed already, is left alone.
func (a *ApprovalTimers) Arm(sub record.Submission) {
	if a == nil || !sub.Waiting() || sub.ApprovalDeadline.IsZero() {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped || a.timers[sub.ID] != nil {
		return
	}
	id := sub.ID
	a.timers[id] = time.AfterFunc(time.Until(sub.ApprovalDeadline), func() {
		a.expire(id)
		a.mu.Lock()
		delete(a.timers, id)
		a.mu.Unlock()
	})
}

// Stop stops the timers; the next start's recovery arms them again.
func (a *ApprovalTimers) Stop() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopped = true
	for id, t := range a.timers {
		t.Stop()
		delete(a.timers, id)
	}
}

// expire denies what is still undecided of a waiting submission. When a
// person decided some meanwhile (ErrAlreadyDecided), what is left is read
// again.
func (a *ApprovalTimers) expire(id string) {
	for range 3 {
		sub, err := a.log.Submission(a.ctx, id)
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
		res, _, err := a.log.Decide(a.ctx, dec)
		switch {
		case err == nil:
			if res.Resumed && a.resumed != nil {
				a.resumed(sub.Key)
			}
			return
		case errors.Is(err, clog.ErrAlreadyDecided):
			continue
		case errors.Is(err, clog.ErrNotWaiting), errors.Is(err, clog.ErrSubmissionNotFound), a.ctx.Err() != nil:
			return
		default:
			a.logger.Error("worker: deny expired approval requests", "submission", id, "err", err)
			return
		}
	}
}
