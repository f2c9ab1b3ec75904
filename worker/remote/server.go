package remote

import (
	"context"
	"errors"
	"fmt"
	"github.com/convlog/convlog/internal/conversation"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
)

// ServerConfig configures the log owner's side.
type ServerConfig struct {
	Log       *clog.DB
	NATS      *nats.Conn
	Namespace natsbus.Namespace
	// Replicas of the lease bucket, as the workers open it. Default 1.
	Replicas int
	// LeaseTTL must be the workers' (the bucket has one TTL). Default
	// natsbus.DefaultLeaseTTL.
	LeaseTTL time.Duration
	Logger   *slog.Logger
	// MaxInFlight bounds the requests being answered at once; the rest
	// wait in the subscription (whose own limits then drop, and the
	// workers retry). Default 256.
	MaxInFlight int
}

// Server answers the remote workers' log requests for the log's owner, and
// holds the namespace claim that a pool would hold in one process.
type Server struct {
	cfg    ServerConfig
	logger *slog.Logger

	mu      sync.Mutex
	leases  *natsbus.Leases
	started bool
	err     error // why not started yet
	// approvals are the approval timers of the log, while Run runs.
	approvals *pool.ApprovalTimers

	handlers sync.WaitGroup
	sem      chan struct{}
	quiesce  quiesced // sessions whose turns may not start now
}

// NewServer makes a server; Run starts it.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Log == nil || cfg.NATS == nil {
		return nil, errors.New("remote server: Log and NATS are required")
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = natsbus.DefaultLeaseTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 256
	}
	return &Server{cfg: cfg, logger: cfg.Logger, sem: make(chan struct{}, cfg.MaxInFlight)}, nil
}

// Ready reports whether workers can be answered: the lease bucket open and
// the namespace claimed.
func (s *Server) Ready() error {
	if st := s.cfg.NATS.Status(); st != nats.CONNECTED {
		return fmt.Errorf("nats %s", st)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		if s.err != nil {
			return fmt.Errorf("remote workers not served yet: %w", s.err)
		}
		return errors.New("remote workers not served yet")
	}
	return nil
}

// Run answers requests until ctx ends. It returns an error only when the
// namespace belongs to another data folder.
func (s *Server) Run(ctx context.Context) error {
	js, err := jetstream.New(s.cfg.NATS)
	if err != nil {
		return fmt.Errorf("remote server: %w", err)
	}
	var claim *natsbus.Claim
	start := func() error {
		// Not cancelled by a stop: the broker completes a bucket creation
		// its caller gave up on (see pool.Pool's start).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		// The stream and the bucket are the owner's to make: the workers
		// only look them up (natsbus.BindStream).
		if _, err := natsbus.EnsureStreamReplicas(sctx, js, s.cfg.Namespace, s.cfg.Replicas); err != nil {
			return err
		}
		leases, err := natsbus.OpenLeasesReplicas(sctx, js, s.cfg.Namespace, s.cfg.LeaseTTL, s.cfg.Log.InstanceID(), s.cfg.Replicas)
		if err != nil {
			return err
		}
		if claim, err = leases.ClaimNamespace(sctx, s.cfg.Namespace); err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.leases, s.started, s.err = leases, true, nil
		return nil
	}
	failed := func(err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.err = err
	}
	if err := natsbus.RetryStart(ctx, s.logger, "remote: cannot serve workers yet", start, failed); err != nil {
		return fmt.Errorf("remote server: %w", err)
	}
	if claim == nil {
		return nil // stopped before it started
	}
	reqCtx, cancelReqs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()
	sub, err := s.cfg.NATS.QueueSubscribe(s.cfg.Namespace.LogSubject("*"), "owner", func(m *nats.Msg) {
		s.sem <- struct{}{} // bounded: the subscription's buffer waits
		s.handlers.Add(1)
		go func() {
			defer s.handlers.Done()
			defer func() { <-s.sem }()
			s.answer(reqCtx, m)
		}()
	})
	if err != nil {
		return fmt.Errorf("remote server: subscribe: %w", err)
	}
	// The approval timers are the log owner's: armed from a scan now and
	// on each sweep, and after every Await a worker writes.
	timers := pool.NewApprovalTimers(reqCtx, s.cfg.Log, s.logger, nil)
	s.mu.Lock()
	s.approvals = timers
	s.mu.Unlock()
	defer timers.Stop()
	s.armApprovals(ctx, timers)
	sweep := time.NewTicker(approvalSweep)
	defer sweep.Stop()
	t := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer t.Stop()
	var lost error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-sweep.C:
			s.armApprovals(ctx, timers)
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, s.cfg.LeaseTTL/3)
			err := claim.Renew(rctx)
			cancel()
			if errors.Is(err, natsbus.ErrNamespaceInUse) {
				lost = fmt.Errorf("remote server: %w", err)
				break loop
			} else if err != nil && ctx.Err() == nil {
				s.logger.Warn("remote: renew the namespace claim", "err", err)
			}
		}
	}
	_ = sub.Unsubscribe()
	s.handlers.Wait()
	if lost == nil {
		if err := claim.Release(context.WithoutCancel(ctx)); err != nil {
			s.logger.Warn("remote: release the namespace claim (it will lapse)", "err", err)
		}
	}
	return lost
}

// approvalSweep is how often the owner scans for waiting submissions
// whose approval timer it has not armed (a deadline set before it
// started).
const approvalSweep = 10 * time.Second

// armApprovals arms the timers of every waiting submission with a
// deadline.
func (s *Server) armApprovals(ctx context.Context, timers *pool.ApprovalTimers) {
	var cursor clog.ScanCursor
	for {
		subs, next, err := s.cfg.Log.UnsettledPage(ctx, cursor, 1000)
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("remote: scan for approval deadlines", "err", err)
			}
			return
		}
		for _, sub := range subs {
			timers.Arm(sub)
		}
		if next == "" {
			return
		}
		cursor = next
	}
}

func (s *Server) answer(ctx context.Context, m *nats.Msg) {
	var rq request
	var res response
	if err := decode(m.Data, &rq); err != nil {
		res.setErr(fmt.Errorf("%w: %v", clog.ErrInvalidRecord, err))
	} else {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res = s.do(ctx, subjectOp(m.Subject), &rq)
		cancel()
	}
	if m.Reply == "" {
		return
	}
	data := encode(&res)
	if max := s.cfg.NATS.MaxPayload(); max > 0 && int64(len(data)) > max {
		// Dropped by the broker, it would leave the worker retrying a
		// request that can never be answered: say so instead.
		s.logger.Error("remote: an answer exceeds the broker's max_payload; raise it (docs/scale-out.md)",
			"op", subjectOp(m.Subject), "bytes", len(data), "max_payload", max)
		res = response{}
		res.setErr(fmt.Errorf("%w: the answer to %s is %d bytes, over the broker's max_payload of %d",
			ErrTooLarge, subjectOp(m.Subject), len(data), max))
		data = encode(&res)
	}
	if err := m.Respond(data); err != nil {
		s.logger.Warn("remote: respond", "op", subjectOp(m.Subject), "err", err)
	}
}

func (s *Server) do(ctx context.Context, op string, rq *request) (res response) {
	db := s.cfg.Log
	var err error
	switch op {
	case opSubmission:
		res.Sub, err = db.Submission(ctx, rq.ID)
	case opPending:
		res.Subs, err = db.PendingFirst(ctx, rq.Key, rq.Limit)
	case opUnsettled:
		res.Subs, res.Cursor, err = db.UnsettledPage(ctx, rq.Cursor, rq.Limit)
	case opRead:
		// A conversation's content goes only to the worker running its
		// turn: the owner reads its own log directly, so a read that
		// comes here and names no lease it holds is no one's business.
		if err = s.holds(ctx, rq.Key, rq.Fence.Lease); err == nil {
			res.Read, err = db.Read(ctx, rq.Key, rq.Offset, rq.Limit)
		}
	case opTail:
		res.Inc, res.Offset, err = db.Tail(ctx, rq.Key)
	case opInstance:
		res.Instance = db.InstanceID()
	case opWrite:
		res.Appended, err = s.write(ctx, rq)
	default:
		err = fmt.Errorf("%w: unknown operation %q", clog.ErrInvalidRecord, op)
	}
	res.setErr(err)
	return res
}

// write commits a worker's write if its fence holds, and answers a retry
// of a write already committed as that write's success.
func (s *Server) write(ctx context.Context, rq *request) (clog.Appended, error) {
	w := rq.Write
	// Every write is fenced: one that names no lease, or a lease the
	// bucket no longer gives its writer, could come from anyone on the
	// broker or from a worker another has replaced.
	if err := s.holds(ctx, w.Key, rq.Fence.Lease); err != nil {
		return clog.Appended{}, fmt.Errorf("%w: %s turn %s step %d: %w", ErrFenced, w.Key, w.TurnID, rq.Fence.Step, err)
	}
	if len(w.Start) > 0 {
		// A turn does not start in the middle of a lifecycle change.
		if err := s.quiesce.wait(ctx, w.Key); err != nil {
			return clog.Appended{}, err
		}
	}
	app, err := s.cfg.Log.Write(ctx, w)
	if err == nil && w.Await != nil {
		s.mu.Lock()
		timers := s.approvals
		s.mu.Unlock()
		if sub, serr := s.cfg.Log.Submission(ctx, w.Await.SubmissionID); serr == nil {
			timers.Arm(sub)
		}
	}
	if err != nil && s.replayed(ctx, w, err) {
		s.logger.Info("remote: a retried write was committed already", "session", w.Key.String(), "turn", w.TurnID, "step", rq.Fence.Step)
		inc, next, terr := s.cfg.Log.Tail(ctx, w.Key)
		if terr != nil {
			return clog.Appended{}, terr
		}
		return clog.Appended{Incarnation: inc, NextOffset: next}, nil
	}
	return app, err
}

// holds returns nil if the session's lease names holder, a live lease
// (the bucket's entries lapse a TTL after their holder's last renewal),
// and ErrNotLeaseHolder otherwise.
func (s *Server) holds(ctx context.Context, key record.Key, holder string) error {
	if holder == "" {
		return fmt.Errorf("%w: the request names no session lease", ErrNotLeaseHolder)
	}
	s.mu.Lock()
	leases := s.leases
	s.mu.Unlock()
	if leases == nil {
		return fmt.Errorf("%w: the lease bucket is not open yet", errUnavailable)
	}
	got, err := leases.Holder(ctx, key)
	if err != nil {
		return fmt.Errorf("%w: check the lease: %v", errUnavailable, err)
	}
	if got != holder {
		if got == "" {
			return fmt.Errorf("%w: no one holds the lease of %s", ErrNotLeaseHolder, key)
		}
		return fmt.Errorf("%w: the lease of %s names %q", ErrNotLeaseHolder, key, got)
	}
	return nil
}

// replayed reports whether a write refused with err is one already in the
// log: its entries (whose ids the client fixed before the first attempt)
// are there, or its starts and settlements are the submissions' state.
// Writes commit atomically, so any part found means the whole write was.
func (s *Server) replayed(ctx context.Context, w clog.Write, err error) bool {
	if len(w.Start) == 0 && len(w.Settle) == 0 && w.Await == nil {
		return errors.Is(err, clog.ErrDuplicateEntry)
	}
	if !errors.Is(err, clog.ErrSubmissionSettled) && !errors.Is(err, clog.ErrSubmissionState) {
		return false
	}
	for _, id := range w.Start {
		// Started by this write: running as its turn. (A resumable one
		// is input_required, and was admitted before: not started yet.)
		sub, err := s.cfg.Log.Submission(ctx, id)
		if err != nil || sub.Status != record.StatusRunning || sub.TurnID != w.TurnID {
			return false
		}
	}
	if a := w.Await; a != nil {
		// Waiting on this write's requests, asked by its turn.
		sub, err := s.cfg.Log.Submission(ctx, a.SubmissionID)
		if err != nil || sub.Status != record.StatusInputRequired || sub.TurnID != w.TurnID || len(sub.Approvals) != len(a.Requests) {
			return false
		}
		for i, r := range a.Requests {
			if sub.Approvals[i].ApprovalID != r.ApprovalID {
				return false
			}
		}
	}
	for _, st := range w.Settle {
		sub, err := s.cfg.Log.Submission(ctx, st.SubmissionID)
		if err != nil || sub.Status != record.Status(st.Outcome) || (w.TurnID != "" && sub.TurnID != w.TurnID) {
			return false
		}
		if (sub.Error == nil) != (st.Error == nil) || (sub.Error != nil && sub.Error.Code != st.Error.Code) {
			return false
		}
	}
	return true
}

// The remote workers' log owner is the conversation.Runner of a process
// that runs no agents.
var _ conversation.Runner = (*Server)(nil)

// Claim makes no fast-path offer: the turns start in other processes.
func (s *Server) Claim(record.Key) conversation.Claim { return nil }

// Abort ends a submission for the HTTP API when no agents run in this
// process (`serve --workers=0`): one not yet started, or waiting for an
// approval (no worker holds it), is settled aborted here; a running one is cancelled by the worker that runs it, which is
// asked over NATS and answers once the turn has settled (within ctx). If
// no worker answers, the turn's worker is gone and the sweep of another
// settles it interrupted once its lease lapses.
func (s *Server) Abort(ctx context.Context, id string) (record.Submission, error) {
	db := s.cfg.Log
	sub, err := db.Submission(ctx, id)
	if err != nil {
		return record.Submission{}, err
	}
	if sub.Status.Terminal() {
		return sub, fmt.Errorf("abort %s: %w", id, clog.ErrSubmissionSettled)
	}
	if sub.Status == record.StatusAdmitted || sub.Status == record.StatusInputRequired {
		// No worker holds it: one waiting for approval is no turn's.
		msg := "aborted before it ran"
		if sub.Status == record.StatusInputRequired {
			msg = "aborted while waiting for approval"
		}
		_, err := db.Write(ctx, clog.Write{Key: sub.Key, Settle: []record.Settlement{{
			SubmissionID: id, Outcome: record.OutcomeAborted,
			Error: &record.Failure{Code: "aborted", Message: msg},
		}}})
		if err == nil {
			return db.Submission(ctx, id)
		}
		if !errors.Is(err, clog.ErrSubmissionState) && !errors.Is(err, clog.ErrSubmissionSettled) {
			return record.Submission{}, fmt.Errorf("abort %s: %w", id, err)
		}
		// Started (or settled) meanwhile by a worker: ask it, below.
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := s.cfg.NATS.RequestWithContext(actx, s.cfg.Namespace.AbortSubject(), []byte(id))
	if err == nil {
		var res response
		if err := decode(m.Data, &res); err == nil && res.err() == nil {
			return res.Sub, nil
		}
	}
	return db.Submission(context.WithoutCancel(ctx), id)
}

// Quiesce runs fn, a lifecycle change of keys, with no turn of theirs
// running on a worker, as pool.Pool.Quiesce does for turns in-process:
// while it runs, a worker's write that would start a turn of keys waits;
// running turns are aborted and waited for (each worker answers its abort
// once the turn has settled, or the abort gives up after its bound) before
// fn when abortFirst, else told to stop after fn.
func (s *Server) Quiesce(ctx context.Context, keys []record.Key, abortFirst bool, fn func(context.Context) error) error {
	release := s.quiesce.hold(keys)
	defer release()
	var running []string
	for _, k := range keys {
		subs, err := s.cfg.Log.PendingFirst(ctx, k, 512)
		if err != nil {
			return err
		}
		for _, sub := range subs {
			if sub.Status == record.StatusRunning {
				running = append(running, sub.ID)
			}
		}
	}
	if abortFirst {
		for _, id := range running {
			if _, err := s.Abort(ctx, id); err != nil && !errors.Is(err, clog.ErrSubmissionSettled) {
				s.logger.Warn("remote: aborting a running turn before a lifecycle change", "submission", id, "err", err)
			}
		}
	}
	err := fn(ctx)
	if !abortFirst {
		// The change settled them already; their workers are told to
		// stop, without waiting for an answer.
		for _, id := range running {
			if perr := s.cfg.NATS.Publish(s.cfg.Namespace.AbortSubject(), []byte(id)); perr != nil {
				s.logger.Warn("remote: stopping a turn after a lifecycle change", "submission", id, "err", perr)
			}
		}
	}
	return err
}

// quiesced is the set of sessions whose lifecycle change is under way.
type quiesced struct {
	mu   sync.Mutex
	keys map[record.Key]int
	free chan struct{} // closed (and replaced) whenever a hold ends
}

func (q *quiesced) hold(keys []record.Key) (release func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.keys == nil {
		q.keys, q.free = map[record.Key]int{}, make(chan struct{})
	}
	for _, k := range keys {
		q.keys[k]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			for _, k := range keys {
				if q.keys[k]--; q.keys[k] == 0 {
					delete(q.keys, k)
				}
			}
			close(q.free)
			q.free = make(chan struct{})
		})
	}
}

// wait returns once key is not held, or with ctx's error.
func (q *quiesced) wait(ctx context.Context, key record.Key) error {
	for {
		q.mu.Lock()
		held, free := q.keys[key] > 0, q.free
		q.mu.Unlock()
		if !held {
			return nil
		}
		select {
		case <-free:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for a lifecycle change of %s: %v", errUnavailable, key, ctx.Err())
		}
	}
}
