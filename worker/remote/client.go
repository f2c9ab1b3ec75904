package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
)

// ClientConfig configures a remote worker's view of the log.
type ClientConfig struct {
	NATS      *nats.Conn
	Namespace natsbus.Namespace
	// Attempt bounds one request's wait for its reply. Default 5s.
	Attempt time.Duration
	// RetryFor is how long a request is retried while the owner does not
	// answer (it restarts, the broker elects a leader) before the call
	// fails. Default 30s.
	RetryFor time.Duration
	Logger   *slog.Logger
}

// Client is the log of another process, asked over NATS: a pool.Log and a
// pool.FencedLog for a remote worker's pool.
type Client struct {
	cfg   ClientConfig
	id    string
	lease string // the name this process's leases hold (natsbus.LeaseOwner)
}

var (
	_ pool.Log       = (*Client)(nil)
	_ pool.FencedLog = (*Client)(nil)
)

// NewClient makes a client. Its InstanceID names this worker process,
// fresh each start, so that its leases are its own: a worker has no data
// folder whose lock would prove an earlier holder dead.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.NATS == nil {
		return nil, errors.New("remote client: NATS is required")
	}
	if cfg.Namespace != "" {
		if err := cfg.Namespace.Validate(); err != nil {
			return nil, err
		}
	}
	if cfg.Attempt <= 0 {
		cfg.Attempt = 5 * time.Second
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	id := "worker-" + ulid.Make().String()
	return &Client{cfg: cfg, id: id, lease: natsbus.LeaseOwner(id)}, nil
}

// retryable reports a failure worth asking again: no reply, no owner
// subscribed yet, or the owner unable for a moment.
func retryable(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, errUnavailable) || errors.Is(err, clog.ErrClosed)
}

// call sends rq to the owner and retries it, unchanged, until it is
// answered, ctx ends or RetryFor has passed. Every operation is safe to
// repeat: reads, and writes by the replay rule (see Server.write).
func (c *Client) call(ctx context.Context, op string, rq *request) (response, error) {
	data := encode(rq)
	subj := c.cfg.Namespace.LogSubject(op)
	giveUp := time.Now().Add(c.cfg.RetryFor)
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.cfg.Attempt)
		m, err := c.cfg.NATS.RequestWithContext(actx, subj, data)
		cancel()
		if errors.Is(err, nats.ErrMaxPayload) {
			return response{}, fmt.Errorf("%w: the %s request is %d bytes, over the broker's max_payload of %d",
				ErrTooLarge, op, len(data), c.cfg.NATS.MaxPayload())
		}
		var res response
		if err == nil {
			if err = decode(m.Data, &res); err == nil {
				err = res.err()
			}
		}
		if err == nil || !retryable(err) || ctx.Err() != nil || time.Now().After(giveUp) {
			if err != nil && ctx.Err() != nil {
				err = errors.Join(ctx.Err(), err)
			}
			return res, err
		}
		c.cfg.Logger.Debug("remote: retrying a log request", "op", op, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// InstanceID names this worker process (see NewClient).
func (c *Client) InstanceID() string { return c.id }

// Unpublished and MarkPublished: the outbox is relayed by the owner.
func (c *Client) Unpublished(context.Context, int) ([]record.Submission, error) { return nil, nil }
func (c *Client) MarkPublished(context.Context, ...string) error                { return nil }

func (c *Client) Submission(ctx context.Context, id string) (record.Submission, error) {
	res, err := c.call(ctx, opSubmission, &request{ID: id})
	return res.Sub, err
}

func (c *Client) PendingFirst(ctx context.Context, key record.Key, limit int) ([]record.Submission, error) {
	res, err := c.call(ctx, opPending, &request{Key: key, Limit: limit})
	return res.Subs, err
}

func (c *Client) UnsettledPage(ctx context.Context, cursor clog.ScanCursor, limit int) ([]record.Submission, clog.ScanCursor, error) {
	res, err := c.call(ctx, opUnsettled, &request{Cursor: cursor, Limit: limit})
	return res.Subs, res.Cursor, err
}

func (c *Client) Read(ctx context.Context, key record.Key, offset record.Offset, limit int) (record.ReadResult, error) {
	// Named by this process's lease name: the owner answers only the
	// session's holder (Server's opRead).
	res, err := c.call(ctx, opRead, &request{Key: key, Offset: offset, Limit: limit, Fence: pool.Fence{Lease: c.lease}})
	return res.Read, err
}

func (c *Client) Tail(ctx context.Context, key record.Key) (record.Incarnation, record.Offset, error) {
	res, err := c.call(ctx, opTail, &request{Key: key})
	return res.Inc, res.Offset, err
}

// Write commits w unfenced, which the owner refuses (ErrFenced): every
// write of a remote worker is a turn's, under its session lease.
func (c *Client) Write(ctx context.Context, w clog.Write) (clog.Appended, error) {
	return c.WriteFenced(ctx, w, pool.Fence{})
}

// WriteFenced commits w if the lease f names is still the writer's. The
// ids of w's entries are fixed here, once, so that every retry of this
// write is recognisably the same write.
func (c *Client) WriteFenced(ctx context.Context, w clog.Write, f pool.Fence) (clog.Appended, error) {
	recs := make([]record.Record, len(w.Records))
	for i, r := range w.Records {
		if r.Entry != nil {
			e := *r.Entry
			if e.ID == "" {
				e.ID = ulid.Make().String()
			}
			r.Entry = &e
		}
		recs[i] = r
	}
	w.Records = recs
	res, err := c.call(ctx, opWrite, &request{Write: w, Fence: f})
	if err != nil {
		return clog.Appended{}, fmt.Errorf("write %s: %w", w.Key, err)
	}
	return res.Appended, nil
}

// ServeAborts answers the log owner's aborts (Server.Abort) for the turns
// running in p, until ctx ends. A worker that does not run the submission
// stays silent, so the one that does is the one that answers.
func ServeAborts(ctx context.Context, nc *nats.Conn, ns natsbus.Namespace, p *pool.Pool) error {
	inflight := make(chan struct{}, 64)
	sub, err := nc.Subscribe(ns.AbortSubject(), func(m *nats.Msg) {
		select {
		case inflight <- struct{}{}:
		default:
			return // the owner asks again or the sweep settles it
		}
		go func() {
			defer func() { <-inflight }()
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			sub, ok, err := p.AbortHere(actx, string(m.Data))
			if !ok {
				return
			}
			var res response
			res.Sub = sub
			res.setErr(err)
			_ = m.Respond(encode(&res))
		}()
	})
	if err != nil {
		return fmt.Errorf("subscribe aborts: %w", err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	for range cap(inflight) {
		inflight <- struct{}{} // wait for the answers under way
	}
	return nil
}
