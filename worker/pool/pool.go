package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/convlog/convlog/internal/conversation"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/natsbus"
)

// Log is what the pool needs of the log; *log.DB is one.
type Log interface {
	natsbus.Outbox
	Submission(ctx context.Context, id string) (record.Submission, error)
	// PendingFirst is the session's first limit unsettled submissions.
	PendingFirst(ctx context.Context, key record.Key, limit int) ([]record.Submission, error)
	UnsettledPage(ctx context.Context, cursor clog.ScanCursor, limit int) ([]record.Submission, clog.ScanCursor, error)
	Read(ctx context.Context, key record.Key, offset record.Offset, limit int) (record.ReadResult, error)
	Write(ctx context.Context, w clog.Write) (clog.Appended, error)
	Tail(ctx context.Context, key record.Key) (record.Incarnation, record.Offset, error)
	// InstanceID names the log's data folder (log.DB.InstanceID).
	InstanceID() string
}

// Config configures a Pool.
type Config struct {
	Log    Log
	NATS   *nats.Conn
	Agents *Registry
	Deltas *natsbus.DeltaBus
	Logger *slog.Logger
	// Namespace prefixes the NATS names; "" is DefaultNamespace.
	Namespace natsbus.Namespace
	// ShutdownTimeout is how long running turns may go on after Run's
	// context ends; then they are cancelled and settled interrupted.
	ShutdownTimeout time.Duration
	// LeaseTTL is how long the session lease of a dead worker lasts.
	// Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Linger is how long an idle runner keeps its session's lease, so that
	// the next message of a conversation in progress starts its turn in
	// its admission's own commit. Default DefaultLinger.
	Linger time.Duration
	// SweepInterval is how often the pool looks in the log for admitted
	// (or resumable) submissions whose doorbell was lost, and arms the
	// approval timers of waiting ones. Default 10s.
	SweepInterval time.Duration
	// ScanPage is how many unsettled submissions recovery and the sweep
	// load at a time. Default 1000.
	ScanPage int
	// Observer is told about turns and leases, for metrics. May be nil.
	Observer Observer
	// Replicas is how many servers of a NATS cluster keep the submissions
	// stream and the lease bucket. Default 1.
	Replicas int
	// Remote says the log is another process's (package worker/remote):
	// its owner holds the namespace claim, which the pools of remote
	// workers do not take.
	Remote bool
}

// Observer is told about the pool's work, for metrics. Its methods are
// called on the turns' goroutines and must not block.
type Observer interface {
	// TurnEnded reports a settled turn of agent: its outcome and how long
	// it took from its start to its settlement.
	TurnEnded(agent string, outcome record.Outcome, d time.Duration)
	// LeaseLost reports a turn stopped because its session lease could
	// not be renewed.
	LeaseLost()
}

// Running is the number of turns this pool is running, and of the
// submissions they answer.
func (p *Pool) Running() (turns, submissions int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := make(map[*turnState]struct{}, len(p.running))
	for _, ts := range p.running {
		seen[ts] = struct{}{}
	}
	return len(seen), len(p.running)
}

// The pool is the local conversation.Runner.
var _ conversation.Runner = (*Pool)(nil)

// Pool consumes admitted submissions and runs their turns: one at a time
// per session, in admission order, each submission at most once.
type Pool struct {
	cfg    Config
	logger *slog.Logger
	js     jetstream.JetStream
	leases *natsbus.Leases
	claim  *natsbus.Claim // this data folder's hold on the namespace

	// turnsCtx parents every turn; cancelling it interrupts them all.
	turnsCtx    context.Context
	cancelTurns context.CancelCauseFunc

	stopCh chan struct{} // closed when the pool stops taking work

	mu        sync.Mutex
	sessions  map[record.Key]*session // sessions with a runner goroutine
	running   map[string]*turnState   // submission id -> its running turn
	approvals *ApprovalTimers         // nil unless the pool's Log decides (owns the log)
	started   bool                    // leases open, recovery done: turns may run
	startErr  error                   // why not started yet
	early     map[record.Key]bool     // doorbells rung before started
	stopping  bool
	runners   sync.WaitGroup

	// stripes serialize the decision to start or abort submissions of one
	// session, without a lock object per session.
	stripes [64]sync.Mutex
	seed    maphash.Seed
}

type session struct {
	again bool          // work arrived while the runner was busy
	wake  chan struct{} // rung with again, for a runner lingering idle

	lingering bool                    // idle, holding the lease
	claimed   bool                    // a delivery is being admitted to start here
	handoff   chan *record.Submission // the claimed admission, once committed
}

// DefaultLinger is Config.Linger's default: long enough for a person's or
// a script's next message right after a reply, short enough that an idle
// conversation soon holds no goroutine and no lease.
const DefaultLinger = 500 * time.Millisecond

type turnState struct {
	id     string
	key    record.Key
	ids    []string // the submissions it answers
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// Causes of a turn's cancellation.
var (
	errAborted   = errors.New("aborted")
	errLeaseLost = errors.New("session lease lost")
	errShutdown  = errors.New("shutting down")
	errDeadline  = errors.New("turn timeout")
)

// NewPool makes a pool; Run starts it.
func NewPool(cfg Config) (*Pool, error) {
	if cfg.Log == nil || cfg.NATS == nil || cfg.Agents == nil {
		return nil, errors.New("worker pool: Log, NATS and Agents are required")
	}
	if cfg.Namespace != "" {
		if err := cfg.Namespace.Validate(); err != nil {
			return nil, err
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = natsbus.DefaultLeaseTTL
	}
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 10 * time.Second
	}
	if cfg.ScanPage <= 0 {
		cfg.ScanPage = 1000
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("worker pool: %w", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	p := &Pool{
		cfg: cfg, logger: cfg.Logger, js: js,
		turnsCtx: ctx, cancelTurns: cancel,
		sessions: map[record.Key]*session{},
		stopCh:   make(chan struct{}),
		running:  map[string]*turnState{},
		seed:     maphash.MakeSeed(),
	}
	if d, ok := cfg.Log.(Decider); ok && !cfg.Remote {
		// This process owns the log: it runs the approval timers.
		p.approvals = NewApprovalTimers(ctx, d, cfg.Logger, p.dispatch)
	}
	return p, nil
}

// Run recovers what a previous process left unfinished, then consumes until
// ctx ends, then lets running turns finish for ShutdownTimeout before
// interrupting them. It returns when every turn it started has settled.
func (p *Pool) Run(ctx context.Context) (err error) {
	defer p.cancelTurns(nil)
	defer func() {
		if ctx.Err() != nil && err != nil {
			err = nil // stopped while starting: not a failure
		}
	}()
	// The broker may be down: admission does not need it, so the pool
	// waits for it (readiness says so) instead of failing the service.
	var cons jetstream.Consumer
	var admitted []record.Key
	start := func() (err error) {
		cons, admitted, err = p.start(ctx)
		return err
	}
	failed := func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.startErr = err
	}
	if err := natsbus.RetryStart(ctx, p.logger, "worker: cannot start consuming yet", start, failed); err != nil {
		return fmt.Errorf("worker pool: %w", err)
	}
	if cons == nil {
		return nil // stopped before it started
	}
	p.mu.Lock()
	p.started, p.startErr = true, nil
	for k := range p.early {
		admitted = append(admitted, k)
	}
	p.early = nil
	p.mu.Unlock()
	cc, err := cons.Consume(p.handle, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		p.logger.Debug("worker: consume", "err", err)
	}))
	if err != nil {
		return fmt.Errorf("worker pool: consume: %w", err)
	}
	for _, k := range admitted {
		p.dispatch(k)
	}
	sweep := time.NewTicker(p.cfg.SweepInterval)
	defer sweep.Stop()
	claimCtx, stopClaim := context.WithCancel(ctx)
	claimLost := make(chan error, 1)
	claimKept := make(chan struct{})
	go func() {
		defer close(claimKept)
		if p.claim != nil {
			p.keepClaim(claimCtx, claimLost)
		}
	}()
	var lost error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case lost = <-claimLost:
			p.logger.Error("worker: another data folder took this NATS namespace; stopping", "err", lost)
			break loop
		case <-sweep.C:
			p.sweep(ctx)
		}
	}
	stopClaim()
	<-claimKept
	cc.Stop()
	<-cc.Closed()
	err = p.drain()
	if lost == nil && p.claim != nil {
		if rerr := p.claim.Release(context.WithoutCancel(ctx)); rerr != nil {
			p.logger.Warn("worker: release the namespace claim (it will lapse)", "err", rerr)
		}
	}
	return errors.Join(lost, err)
}

// keepClaim renews the namespace claim until ctx ends, and reports on lost
// if another data folder has taken it.
func (p *Pool) keepClaim(ctx context.Context, lost chan<- error) {
	t := time.NewTicker(p.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, p.cfg.LeaseTTL/3)
			err := p.claim.Renew(rctx)
			cancel()
			switch {
			case errors.Is(err, natsbus.ErrNamespaceInUse):
				lost <- fmt.Errorf("worker pool: %w", err)
				return
			case err != nil && ctx.Err() == nil:
				p.logger.Warn("worker: renew the namespace claim", "err", err)
			}
		}
	}
}

// start sets up the stream, the consumer and the lease bucket and recovers
// what a dead process left; it returns the sessions with admitted work.
func (p *Pool) start(ctx context.Context) (jetstream.Consumer, []record.Key, error) {
	// The broker carries out a stream or bucket creation even when its
	// caller gives up, so a stop during setup does not cancel these calls
	// (it waits up to setupTimeout for them): a stop that did would shut
	// an embedded server down under a creation still in flight, which
	// leaves that store's goroutines running.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), setupTimeout)
	defer cancel()
	var cons jetstream.Consumer
	var err error
	if p.cfg.Remote {
		// The log's owner creates the stream and the bucket: a remote
		// worker's broker role may not change them (natsbus.WorkerPermissions).
		cons, err = natsbus.BindStream(sctx, p.js, p.cfg.Namespace)
	} else {
		cons, err = natsbus.EnsureStreamReplicas(sctx, p.js, p.cfg.Namespace, p.cfg.Replicas)
	}
	if err != nil {
		return nil, nil, err
	}
	if p.leases == nil {
		if p.cfg.Remote {
			p.leases, err = natsbus.BindLeases(sctx, p.js, p.cfg.Namespace, p.cfg.LeaseTTL, p.cfg.Log.InstanceID())
		} else {
			p.leases, err = natsbus.OpenLeasesReplicas(sctx, p.js, p.cfg.Namespace, p.cfg.LeaseTTL, p.cfg.Log.InstanceID(), p.cfg.Replicas)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if p.claim == nil && !p.cfg.Remote {
		if p.claim, err = p.leases.ClaimNamespace(sctx, p.cfg.Namespace); err != nil {
			return nil, nil, err
		}
	}
	admitted, err := p.recover(ctx)
	if err != nil {
		return nil, nil, err
	}
	return cons, admitted, nil
}

// setupTimeout bounds the JetStream setup of start.
const setupTimeout = 15 * time.Second

// drain stops new turns and waits for running ones, interrupting them
// after the shutdown timeout.
func (p *Pool) drain() error {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	close(p.stopCh)
	p.approvals.Stop()
	done := make(chan struct{})
	go func() { p.runners.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(p.cfg.ShutdownTimeout):
	}
	p.cancelTurns(errShutdown)
	select {
	case <-done:
		return nil
	case <-time.After(5 * time.Second):
		// An agent that ignores cancellation; its submissions stay running
		// and the next start settles them interrupted.
		return errors.New("worker pool: turns did not stop within 5s of cancellation")
	}
}

// handle rings the doorbell of a submission's session. The log decides
// what runs; the message only says where to look.
func (p *Pool) handle(msg jetstream.Msg) {
	var m natsbus.SubmissionMsg
	key := record.Key{}
	if err := json.Unmarshal(msg.Data(), &m); err == nil {
		key = record.Key{Agent: m.Agent, Instance: m.Instance, Session: m.Session}
	}
	if m.SubmissionID == "" || key.Validate() != nil {
		p.logger.Warn("worker: dropping malformed submission message", "subject", msg.Subject())
		return
	}
	p.dispatch(key)
}

// Claim is a pool's offer (a conversation.Claim) to start one delivery in
// its admission's own commit. The caller admits with StartTurn = TurnID(), reports the
// committed submission with Started, and always calls Release, typically
// with defer: Release after Started hands the submission to the session's
// runner, Release without it tells the runner nothing started. Release is
// idempotent, and a Claim that offers nothing (TurnID "") is a no-op.
type Claim struct {
	turnID  string
	s       *session
	started record.Submission
	once    sync.Once
}

// TurnID is the turn id to admit with, or "" when the pool makes no offer.
func (c *Claim) TurnID() string {
	if c == nil {
		return ""
	}
	return c.turnID
}

// Started records the admission's outcome: the committed submission, which
// runs here only if the admission started it with this claim's turn id.
func (c *Claim) Started(sub record.Submission) {
	if c == nil || c.s == nil {
		return
	}
	c.started = sub
}

// Release hands the claimed admission (or nothing) to the session's runner.
func (c *Claim) Release() {
	if c == nil || c.s == nil {
		return
	}
	c.once.Do(func() {
		sub := c.started
		if sub.Status != record.StatusRunning || sub.TurnID != c.turnID {
			sub = record.Submission{} // not started here: the runner just goes on
		}
		c.s.handoff <- &sub // buffered: never blocks, even if the runner left
	})
}

// Claim offers to start a delivery to key in its admission's own commit:
// when this pool holds the session idle (its runner lingering with the
// lease), the Claim carries a turn id for log.Admission.StartTurn and the
// runner runs the turn without a second commit before the agent.
// Otherwise it offers nothing (nil) and the delivery is admitted as usual.
func (p *Pool) Claim(key record.Key) conversation.Claim {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.sessions[key]
	if s == nil || !s.lingering || s.claimed || p.stopping {
		return nil
	}
	s.claimed = true
	return &Claim{turnID: "turn_" + ulid.Make().String(), s: s}
}

// Idle reports whether this pool holds key's session idle, its runner
// lingering with the lease: a delivery to it now starts in its admission.
func (p *Pool) Idle(key record.Key) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.sessions[key]
	return s != nil && s.lingering && !s.claimed
}

// dispatch makes sure key's runner goroutine is running.
func (p *Pool) dispatch(key record.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return
	}
	if !p.started {
		if p.early == nil {
			p.early = map[record.Key]bool{}
		}
		p.early[key] = true
		return
	}
	if s := p.sessions[key]; s != nil {
		s.again = true
		select {
		case s.wake <- struct{}{}:
		default:
		}
		return
	}
	s := &session{wake: make(chan struct{}, 1), handoff: make(chan *record.Submission, 1)}
	p.sessions[key] = s
	p.runners.Add(1)
	go p.runSession(key, s)
}

// runSession runs the session's turns one after another while it has
// admitted submissions; an idle session has no goroutine.
func (p *Pool) runSession(key record.Key, s *session) {
	defer p.runners.Done()
	var held heldLease // kept across consecutive turns
	defer held.release(p, key)
	var claim *record.Submission
	for {
		ran, err := p.nextTurn(key, &held, claim)
		claim = nil
		if err != nil {
			p.logger.Error("worker: turn", "session", key.String(), "err", err)
		}
		if !ran && held.held() && err == nil {
			// Idle: keep the lease a moment for the conversation's next
			// message, which may be admitted already running here.
			var woke bool
			if claim, woke = p.linger(s); claim != nil || woke {
				continue
			}
		}
		if !ran {
			// Released before the last look at the doorbell: a runner
			// started after this one decides to stop finds it free.
			held.release(p, key)
		}
		if p.runnerDone(key, s, ran, err) {
			return
		}
	}
}

// linger waits up to Config.Linger, holding the lease, for the session's
// next message: a claimed admission to run (claim), or a doorbell (woke).
func (p *Pool) linger(s *session) (claim *record.Submission, woke bool) {
	p.setLingering(s, true)
	t := time.NewTimer(p.cfg.Linger)
	defer t.Stop()
	select {
	case <-s.wake:
		woke = true
	case claim = <-s.handoff:
	case <-t.C:
	case <-p.stopCh:
	}
	if inFlight := p.setLingering(s, false) && claim == nil; inFlight {
		// Its admission is committing: its handoff follows, unless the
		// pool stops first (a started submission is then settled
		// interrupted by the next recovery, as after a crash).
		select {
		case claim = <-s.handoff:
		case <-p.stopCh:
		}
	}
	if claim == nil {
		return nil, woke
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s.claimed = false
	if claim.ID == "" {
		return nil, true // the admission failed or was a replay: look again
	}
	return claim, false
}

// setLingering marks the runner idle with its lease (or not) and reports
// whether an admission has claimed it meanwhile.
func (p *Pool) setLingering(s *session, on bool) (claimed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s.lingering = on
	return s.claimed
}

// runnerDone decides, under the pool's lock, whether the runner stops: the
// pool is stopping, the turn failed, or there is nothing more to do. A
// stopping runner leaves the session map in the same critical section, so
// a doorbell rung after it starts a new runner.
func (p *Pool) runnerDone(key record.Key, s *session, ran bool, err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping || err != nil || (!ran && !s.again) {
		delete(p.sessions, key)
		return true
	}
	s.again = false
	return false
}

func (p *Pool) stripe(key record.Key) *sync.Mutex {
	return &p.stripes[maphash.String(p.seed, key.String())%uint64(len(p.stripes))]
}

// sweep dispatches sessions with admitted submissions, in case a doorbell
// was lost (NATS down when it was due, a message dropped, a lease held by a
// worker that died), and settles turns orphaned by dead workers.
func (p *Pool) sweep(ctx context.Context) {
	err := p.scanUnsettled(ctx, func(s record.Submission) { p.dispatch(s.Key) })
	if err != nil && ctx.Err() == nil {
		p.logger.Warn("worker: sweep", "err", err)
	}
}

// scanUnsettled pages through every unsettled submission: it settles the
// orphans of each page and calls admitted once per session with admitted
// or resumable submissions. A backlog of any size is covered, a page at a time.
func (p *Pool) scanUnsettled(ctx context.Context, admitted func(record.Submission)) error {
	seen := map[record.Key]bool{}
	var cursor clog.ScanCursor
	var orphanErr error // the rest of the scan is still worth doing
	for {
		subs, next, err := p.cfg.Log.UnsettledPage(ctx, cursor, p.cfg.ScanPage)
		if err != nil {
			return errors.Join(orphanErr, err)
		}
		if err := p.settleOrphans(ctx, subs); err != nil && orphanErr == nil {
			orphanErr = err
		}
		for _, s := range subs {
			p.approvals.Arm(s) // a waiting one's deadline, if any
			// A resumable submission (every approval decided) runs as an
			// admitted one does; a waiting one waits for a person, never
			// called interrupted (settleOrphans takes running ones only).
			if s.Runnable() && !seen[s.Key] {
				seen[s.Key] = true
				admitted(s)
			}
		}
		if next == "" {
			return orphanErr
		}
		cursor = next
	}
}

// interruptedFailure is the failure of a turn cut short by its process
// stopping or dying.
var interruptedFailure = record.Failure{
	Code:      "interrupted",
	Message:   "the service stopped while the turn was running; the submission was not re-run",
	Retryable: true,
}

// recover settles what a dead process left running, and returns the
// sessions that have admitted submissions waiting.
func (p *Pool) recover(ctx context.Context) ([]record.Key, error) {
	var admitted []record.Key
	err := p.scanUnsettled(ctx, func(s record.Submission) { admitted = append(admitted, s.Key) })
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	return admitted, nil
}

// settleOrphans settles failed, code "interrupted", every running
// submission whose turn no live worker holds: not running here, and its
// session's lease free (a holder settles before it releases, so a free
// lease on a running submission means its holder died). It is never
// re-run: agents have side effects.
func (p *Pool) settleOrphans(ctx context.Context, subs []record.Submission) error {
	running := map[record.Key][]string{}
	p.mu.Lock()
	for _, s := range subs {
		if s.Status == record.StatusRunning && p.running[s.ID] == nil {
			running[s.Key] = append(running[s.Key], s.ID)
		}
	}
	p.mu.Unlock()
	// Sessions in parallel, so that their writes share group commits.
	var wg sync.WaitGroup
	errs := make(chan error, len(running))
	sem := make(chan struct{}, 64)
	for key, ids := range running {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := p.settleOrphansOf(ctx, key, ids); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// settleOrphansOf settles one session's orphans under its lease, in writes
// small enough for one batch.
func (p *Pool) settleOrphansOf(ctx context.Context, key record.Key, ids []string) error {
	lk := p.stripe(key)
	lk.Lock()
	defer lk.Unlock()
	ls, err := p.leases.Acquire(ctx, key)
	if errors.Is(err, natsbus.ErrLeaseHeld) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("recover %s: %w", key, err)
	}
	defer func() {
		if rerr := ls.Release(context.WithoutCancel(ctx)); rerr != nil {
			p.logger.Warn("worker: release lease (it will lapse)", "session", key.String(), "err", rerr)
		}
	}()
	for chunk := range slices.Chunk(ids, maxTurnSubmissions) {
		w := clog.Write{Key: key}
		for _, id := range chunk {
			f := interruptedFailure
			w.Settle = append(w.Settle, record.Settlement{SubmissionID: id, Outcome: record.OutcomeFailed, Error: &f})
		}
		_, err := p.write(ctx, ls, 0, w)
		switch {
		case errors.Is(err, clog.ErrSubmissionSettled), errors.Is(err, clog.ErrSubmissionState):
			// Settled meanwhile by its holder: nothing to do.
		case err != nil:
			return fmt.Errorf("recover %s: %w", key, err)
		default:
			p.logger.Warn("worker: settled interrupted submissions", "session", key.String(), "count", len(chunk))
		}
	}
	return nil
}

// Abort ends a submission: one not yet started, or waiting for an
// approval, is settled aborted at once;
// a running one has its turn cancelled, and Abort waits (within ctx) for the
// turn to settle. A settled submission is ErrSubmissionSettled.
func (p *Pool) Abort(ctx context.Context, id string) (record.Submission, error) {
	sub, err := p.cfg.Log.Submission(ctx, id)
	if err != nil {
		return record.Submission{}, err
	}
	lk := p.stripe(sub.Key)
	lk.Lock()
	// Under the stripe no turn of this session can start: re-read.
	if sub, err = p.cfg.Log.Submission(ctx, id); err != nil {
		lk.Unlock()
		return record.Submission{}, err
	}
	p.mu.Lock()
	ts := p.running[id]
	p.mu.Unlock()
	switch {
	case sub.Status.Terminal():
		lk.Unlock()
		return sub, fmt.Errorf("abort %s: %w", id, clog.ErrSubmissionSettled)
	case sub.Status == record.StatusRunning && ts != nil:
		lk.Unlock()
		ts.cancel(errAborted)
		select {
		case <-ts.done:
		case <-ctx.Done():
		}
		return p.cfg.Log.Submission(context.WithoutCancel(ctx), id)
	default:
		// Admitted, input_required (no turn holds a waiting submission),
		// or running with no turn in this process (left by a crash
		// before recovery saw it): settle it here.
		msg := "aborted before it ran"
		if sub.Status == record.StatusInputRequired {
			msg = "aborted while waiting for approval"
		}
		_, err := p.cfg.Log.Write(ctx, clog.Write{Key: sub.Key, Settle: []record.Settlement{{
			SubmissionID: id, Outcome: record.OutcomeAborted,
			Error: &record.Failure{Code: "aborted", Message: msg},
		}}})
		lk.Unlock()
		if err != nil {
			return record.Submission{}, fmt.Errorf("abort %s: %w", id, err)
		}
		return p.cfg.Log.Submission(ctx, id)
	}
}

// Ready reports whether the pool can take work: NATS connected.
func (p *Pool) Ready() error {
	if st := p.cfg.NATS.Status(); st != nats.CONNECTED {
		return fmt.Errorf("nats %s", st)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.started {
		if p.startErr != nil {
			return fmt.Errorf("workers not started: %w", p.startErr)
		}
		return errors.New("workers starting")
	}
	return nil
}
