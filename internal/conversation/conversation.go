// Package conversation is the conversation core: the one place that
// changes a session and keeps the rules that go with each change.
//
//   - Admit admits a user message under its agent's rules: the busy policy
//     (join, queue, reject, interrupt), MaxTurns checked inside the
//     admitting transaction, and the fast path that starts the turn in the
//     admission's own commit.
//   - Abort ends one submission; AbortSession every unsettled one of a
//     session.
//   - Change rewinds, regenerates, forks, resets or deletes, serialised per
//     session (a second change is refused, not queued) and with the
//     session's running turns stopped, whichever Runner runs them.
//
// The HTTP server (package transport) decodes requests, calls one method
// here and encodes the answer; the errors it maps are the log's sentinels
// and this package's. Reads are not rules and go to the log directly.
//
// A Runner runs turns: the local worker pool (worker/pool) or, when turns run
// in other processes, the remote workers' log owner (worker/remote). Both
// implement the same small interface, so that a lifecycle change waits for a
// remote turn exactly as for a local one.
package conversation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
)

// Sentinel errors callers branch on.
var (
	// ErrUnknownAgent: no agent of that name is served.
	ErrUnknownAgent = errors.New("no agent named")
	// ErrChangeInProgress: another change holds the session (or its
	// instance). The caller decided on what it saw; retry when it is done.
	ErrChangeInProgress = errors.New("another change to this conversation is in progress; retry when it is done")
)

// Log is what the core needs of the storage engine; *log.DB satisfies it.
type Log interface {
	Admit(ctx context.Context, a log.Admission) (sub record.Submission, replayed bool, err error)
	Change(ctx context.Context, c log.Change) (log.ChangeResult, bool, error)
	Decide(ctx context.Context, d log.Decide) (log.Decided, bool, error)
	Write(ctx context.Context, w log.Write) (log.Appended, error)
	Pending(ctx context.Context, key record.Key) ([]record.Submission, error)
	Submission(ctx context.Context, id string) (record.Submission, error)
	Sessions(ctx context.Context, agent, instance string) ([]log.SessionInfo, error)
}

var _ Log = (*log.DB)(nil)

// Runner runs the turns of sessions. The core drives it; it never decides
// a rule of the conversation itself.
type Runner interface {
	// Claim offers to start a delivery to key in its admission's own commit
	// (log.Admission.StartTurn); nil for no offer.
	Claim(key record.Key) Claim
	// Abort ends a submission: settled aborted at once if it has not
	// started, its turn cancelled and awaited (within ctx) if it runs. It
	// returns the submission as it is after, or an error that wraps
	// log.ErrSubmissionSettled.
	Abort(ctx context.Context, id string) (record.Submission, error)
	// Quiesce runs fn while no turn of keys runs or starts: with
	// abortFirst, running turns are aborted and settled first, else after
	// fn.
	Quiesce(ctx context.Context, keys []record.Key, abortFirst bool, fn func(context.Context) error) error
}

// Claim is a Runner's offer to start one delivery in its admission's
// commit: admit with StartTurn = TurnID(), report the committed submission
// with Started, and always Release (idempotent).
type Claim interface {
	TurnID() string
	Started(record.Submission)
	Release()
}

// Agents says which agents exist and their rules; *pool.Registry
// satisfies it.
type Agents interface {
	Options(name string) (worker.AgentOptions, bool)
	List() []worker.AgentInfo
}

// Outbox is told of each durable admission (not of an idempotent replay),
// to relay it to the workers promptly. Kick must not block.
type Outbox interface {
	Kick()
}

// Config configures a Core.
type Config struct {
	Log    Log    // required
	Agents Agents // required
	Runner Runner // required
	Outbox Outbox // may be nil: admissions are found by the relay's scan
	Logger *slog.Logger
}

// Core is the conversation core. Create it with New.
type Core struct {
	log    Log
	agents Agents
	runner Runner
	outbox Outbox
	logger *slog.Logger

	mu      sync.Mutex
	held    map[string]*holder // "agent\x00instance" (a delete) or "agent\x00instance\x00session"
	waiting int                // retries waiting for their own first try (tests watch it)
}

// holder is a change in progress: the locks it holds share it.
type holder struct {
	idem string        // the change's idempotency key, if any
	done chan struct{} // closed when the change ends
}

// New builds a core.
func New(cfg Config) (*Core, error) {
	if cfg.Log == nil || cfg.Agents == nil || cfg.Runner == nil {
		return nil, errors.New("conversation: Config.Log, Agents and Runner are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Core{log: cfg.Log, agents: cfg.Agents, runner: cfg.Runner, outbox: cfg.Outbox, logger: cfg.Logger, held: map[string]*holder{}}, nil
}

// Agent is the agent's settings, or ErrUnknownAgent.
func (c *Core) Agent(name string) (worker.AgentOptions, error) {
	o, ok := c.agents.Options(name)
	if !ok {
		return o, fmt.Errorf("%w %q", ErrUnknownAgent, name)
	}
	if p, err := worker.ParseBusyPolicy(string(o.Busy)); err == nil {
		o.Busy = p // "" and the deprecated name are join
	}
	return o, nil
}

// Agents describes the agents served.
func (c *Core) Agents() []worker.AgentInfo { return c.agents.List() }

// Admit admits a user message (a.Records) to a.Key under its agent's
// rules. The caller sets what the request says (records, idempotency, uid,
// submission id); the core sets the rest: RejectIfBusy, MaxTurns and the
// fast path's StartTurn. Under the interrupt policy the session's earlier
// unsettled submissions are aborted before Admit returns.
func (c *Core) Admit(ctx context.Context, a log.Admission) (sub record.Submission, replayed bool, err error) {
	o, err := c.Agent(a.Key.Agent)
	if err != nil {
		return sub, false, err
	}
	// Both checked in the admitting transaction, after the idempotency
	// lookup: exact under races, and a retry of an admitted request still
	// gets its 202.
	a.RejectIfBusy = o.Busy == worker.BusyReject
	a.MaxTurns = o.MaxTurns
	a.StartTurn = ""
	claim := c.runner.Claim(a.Key)
	if claim != nil {
		defer claim.Release()
		a.StartTurn = claim.TurnID()
	}
	if sub, replayed, err = c.log.Admit(ctx, a); err != nil || replayed { // a replay admitted nothing new
		return sub, replayed, err
	}
	if claim != nil {
		claim.Started(sub)
	}
	c.admitted()
	if o.Busy == worker.BusyInterrupt {
		c.abortOthers(ctx, a.Key, sub.ID)
	}
	return sub, false, nil
}

func (c *Core) admitted() {
	if c.outbox != nil {
		c.outbox.Kick()
	}
}

// Abort ends a submission (see Runner.Abort). A submission that settled
// otherwise (completed, failed) before the abort reached it is an error
// wrapping log.ErrSubmissionSettled, as for one that was settled already:
// the abort changed nothing.
func (c *Core) Abort(ctx context.Context, id string) (record.Submission, error) {
	sub, err := c.runner.Abort(ctx, id)
	if err != nil {
		return sub, err
	}
	if sub.Status.Terminal() && sub.Status != record.StatusAborted {
		return sub, &SettledError{Status: sub.Status}
	}
	return sub, nil
}

// Decide applies a person's decisions to a submission waiting for tool
// approvals (log.DB.Decide checks them, in one transaction). The decision
// that leaves nothing undecided puts the submission back in the outbox:
// the runner resumes it in a new turn of the same submission.
func (c *Core) Decide(ctx context.Context, d log.Decide) (log.Decided, bool, error) {
	if _, err := c.Agent(d.Key.Agent); err != nil {
		return log.Decided{}, false, err
	}
	res, replayed, err := c.log.Decide(ctx, d)
	if err == nil && res.Resumed && !replayed && c.outbox != nil {
		c.outbox.Kick()
	}
	return res, replayed, err
}

// SettledError is an abort that lost the race to the turn's own
// settlement.
type SettledError struct{ Status record.Status }

func (e *SettledError) Error() string {
	return fmt.Sprintf("the submission settled %s before the abort took effect", e.Status)
}

func (e *SettledError) Unwrap() error { return log.ErrSubmissionSettled }

// interruptTimeout bounds how long an interrupting delivery waits for the
// turns it interrupts to stop.
const interruptTimeout = 30 * time.Second

// AbortSession aborts every unsettled submission of key: each running turn
// is cancelled and settled aborted before it returns.
func (c *Core) AbortSession(ctx context.Context, key record.Key) error {
	return c.abortPending(ctx, key, "")
}

// abortOthers is the interrupt policy: every unsettled submission of key
// admitted before keep is aborted; one admitted after it is a later
// interrupt's, which aborts keep instead. Not within the request's
// context alone: a client that hangs up must not leave an older
// submission running before its own.
func (c *Core) abortOthers(ctx context.Context, key record.Key, keep string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interruptTimeout)
	defer cancel()
	if err := c.abortPending(ctx, key, keep); err != nil {
		c.logger.WarnContext(ctx, "interrupt", "session", key.String(), "err", err)
	}
}

func (c *Core) abortPending(ctx context.Context, key record.Key, keep string) error {
	pending, err := c.log.Pending(ctx, key)
	if err != nil {
		return fmt.Errorf("read pending: %w", err)
	}
	if keep != "" {
		// Pending is in admission order: those before keep are earlier.
		// If keep is no longer pending, it settled (a later interrupt
		// aborted it, say): what is left is not its to abort.
		i := slices.IndexFunc(pending, func(p record.Submission) bool { return p.ID == keep })
		if i < 0 {
			return nil
		}
		pending = pending[:i]
	}
	for _, p := range pending {
		if p.Status.Terminal() {
			continue
		}
		if _, err := c.runner.Abort(ctx, p.ID); err != nil && !errors.Is(err, log.ErrSubmissionSettled) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.logger.DebugContext(ctx, "abort", "submission", p.ID, "err", err)
		}
	}
	return nil
}

// Change makes a lifecycle change. For a regenerate, the agent's MaxTurns
// applies and the new submission is relayed as an admission's; the caller
// sets the rest of ch from its request.
//
// Rewind and regenerate abort the session's running turns first (their
// records would land after the change); a reset settles them in the new
// incarnation, where readers look; a delete aborts every turn of the
// instance and settles queued submissions in their streams before the
// streams end; a fork only copies, holding both conversations so that the
// source's path does not move under the copy.
func (c *Core) Change(ctx context.Context, ch log.Change) (res log.ChangeResult, replayed bool, err error) {
	switch ch.Kind {
	case log.ChangeFork:
		unlock, err := c.lock(ctx, ch.IdempotencyKey, ch.Key, ch.Target)
		if err != nil {
			return res, false, err
		}
		defer unlock()
		return c.log.Change(ctx, ch)
	case log.ChangeDelete:
		return c.deleteInstance(ctx, ch)
	case log.ChangeRegenerate:
		o, err := c.Agent(ch.Key.Agent)
		if err != nil {
			return res, false, err
		}
		ch.MaxTurns = o.MaxTurns
	}
	unlock, err := c.lock(ctx, ch.IdempotencyKey, ch.Key)
	if err != nil {
		return res, false, err
	}
	defer unlock()
	abortFirst := ch.Kind != log.ChangeReset
	err = c.runner.Quiesce(ctx, []record.Key{ch.Key}, abortFirst, func(ctx context.Context) (err error) {
		res, replayed, err = c.log.Change(ctx, ch)
		return err
	})
	if err == nil && !replayed && res.Submission != nil {
		c.admitted()
	}
	return res, replayed, err
}

func (c *Core) deleteInstance(ctx context.Context, ch log.Change) (res log.ChangeResult, replayed bool, err error) {
	unlock, err := c.lock(ctx, ch.IdempotencyKey, record.Key{Agent: ch.Key.Agent, Instance: ch.Key.Instance})
	if err != nil {
		return res, false, err
	}
	defer unlock()
	sessions, err := c.log.Sessions(ctx, ch.Key.Agent, ch.Key.Instance)
	if err != nil && !errors.Is(err, log.ErrInstanceNotFound) {
		return res, false, err
	}
	keys := make([]record.Key, len(sessions))
	for i, si := range sessions {
		keys[i] = record.Key{Agent: ch.Key.Agent, Instance: ch.Key.Instance, Session: si.Session}
	}
	err = c.runner.Quiesce(ctx, keys, true, func(ctx context.Context) (err error) {
		// Queued submissions are settled in their streams in a commit of
		// their own first, so that live readers see them settle before the
		// stream ends. The delete itself settles any admitted meanwhile.
		for _, k := range keys {
			c.settleQueued(ctx, k)
		}
		res, replayed, err = c.log.Change(ctx, ch)
		return err
	})
	return res, replayed, err
}

func (c *Core) settleQueued(ctx context.Context, key record.Key) {
	pending, err := c.log.Pending(ctx, key)
	if err != nil || len(pending) == 0 {
		return
	}
	w := log.Write{Key: key}
	for _, p := range pending {
		if p.Status == record.StatusAdmitted && len(w.Settle) < record.MaxRecordsBatch {
			w.Settle = append(w.Settle, record.Settlement{SubmissionID: p.ID, Outcome: record.OutcomeAborted,
				Error: &record.Failure{Code: "deleted", Message: "the instance was deleted before the submission settled"}})
		}
	}
	if len(w.Settle) == 0 {
		return
	}
	// A race with a turn that starts one of them is lost harmlessly: the
	// delete's own transaction settles whatever is still unsettled.
	_, _ = c.log.Write(ctx, w)
}

// lock takes the change locks of keys (sessions; a key with an empty
// session is the whole instance). It refuses, rather than waits, when
// another change holds any of them or covers them: a change made under
// another would be a lost update. The one exception is a retry of the
// change in progress, known by its idempotency key (a client whose first
// try timed out while the change waited for a turn): it waits for the
// first try, then goes on, and the log replays the first try's answer if
// that one committed.
func (c *Core) lock(ctx context.Context, idem string, keys ...record.Key) (unlock func(), err error) {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.Agent + "\x00" + k.Instance
		if k.Session != "" {
			names[i] += "\x00" + k.Session
		}
	}
	for {
		unlock, wait, err := c.tryLock(idem, names)
		if wait == nil {
			return unlock, err
		}
		select {
		case <-wait:
		case <-ctx.Done():
		}
		c.mu.Lock()
		c.waiting--
		c.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// tryLock takes names, or says which change to wait for (a first try of
// the same idempotent change), or refuses.
func (c *Core) tryLock(idem string, names []string) (unlock func(), wait <-chan struct{}, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range names {
		h := c.holderOf(n)
		if h == nil {
			continue
		}
		if idem != "" && h.idem == idem {
			c.waiting++
			return nil, h.done, nil
		}
		return nil, nil, ErrChangeInProgress
	}
	h := &holder{idem: idem, done: make(chan struct{})}
	for _, n := range names {
		c.held[n] = h
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, n := range names {
				delete(c.held, n)
			}
			close(h.done)
		})
	}, nil, nil
}

// holderOf is the change that holds name or covers it: a session is
// covered by a change of its instance, an instance by a change of any of
// its sessions.
func (c *Core) holderOf(name string) *holder {
	if h := c.held[name]; h != nil {
		return h
	}
	if parts := strings.SplitN(name, "\x00", 3); len(parts) == 3 {
		return c.held[parts[0]+"\x00"+parts[1]]
	}
	for n, h := range c.held {
		if strings.HasPrefix(n, name+"\x00") {
			return h
		}
	}
	return nil
}
