package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/convlog/convlog/log/record"
)

// SubmissionMsg is the JetStream message of an admitted submission. The
// message id (Nats-Msg-Id) is the submission id, so the stream drops a
// relay's repeats.
type SubmissionMsg struct {
	SubmissionID string `json:"submissionId"`
	Agent        string `json:"agent"`
	Instance     string `json:"instance"`
	Session      string `json:"session"`
}

// Outbox is what the relay needs of the log.
type Outbox interface {
	Unpublished(ctx context.Context, limit int) ([]record.Submission, error)
	MarkPublished(ctx context.Context, ids ...string) error
}

// Relay publishes admitted submissions from the log's outbox to JetStream.
// Admission never waits on NATS: the bbolt commit is the admission. The
// relay catches up whenever it is kicked, every second, and after every
// failure, with backoff, so an outage only delays delivery.
type Relay struct {
	ns     Namespace
	log    Outbox
	js     jetstream.JetStream
	logger *slog.Logger

	kick chan struct{}

	mu      sync.Mutex
	lastErr error
	backlog int
}

// NewRelay makes a relay publishing through nc, in namespace ns ("" for
// the default).
func NewRelay(db Outbox, nc *nats.Conn, ns Namespace, logger *slog.Logger) (*Relay, error) {
	if ns != "" {
		if err := ns.Validate(); err != nil {
			return nil, err
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Relay{ns: ns, log: db, js: js, logger: logger, kick: make(chan struct{}, 1)}, nil
}

// Kick asks the relay to publish now. It never blocks.
func (r *Relay) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Healthy reports the last publish failure, nil once publishing works.
func (r *Relay) Healthy() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastErr != nil {
		return fmt.Errorf("relay to jetstream failing (%d or more submissions waiting): %w", r.backlog, r.lastErr)
	}
	return nil
}

const relayPage = 256

// Run relays until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	backoff := 50 * time.Millisecond
	for {
		n, err := r.publishPage(ctx)
		r.mu.Lock()
		r.lastErr, r.backlog = err, n
		r.mu.Unlock()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			r.logger.Warn("relay: publish failed; retrying", "err", err, "backoff", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		case n == relayPage:
			continue // more waiting
		}
		backoff = 50 * time.Millisecond
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-tick.C:
		}
	}
}

// msgID is the JetStream message id of a submission's publication. The
// stream dedupes ids for its duplicate window, which is what makes a
// relay's retry after a lost ack harmless; so an admission is published
// under the submission's id, whatever its status by then (one started in
// its admission is already running). A submission resumed after its
// approvals were decided is in the outbox again, within that window: it is
// published under its id and the turn that asked, marked as a resumption,
// so that each wait's resumption is delivered once and never taken for its
// admission (found by TestApprovalEndToEnd: a fast-path admission's
// resumption was dropped, and waited for the sweep).
func msgID(s record.Submission) string {
	if s.Resumable() {
		return s.ID + "#resume." + s.TurnID
	}
	return s.ID
}

// publishPage publishes one page of the outbox and marks what JetStream
// acknowledged. It returns the page's size.
func (r *Relay) publishPage(ctx context.Context) (int, error) {
	subs, err := r.log.Unpublished(ctx, relayPage)
	if err != nil || len(subs) == 0 {
		return 0, err
	}
	futures := make([]jetstream.PubAckFuture, 0, len(subs))
	var errs []error
	for _, s := range subs {
		data, _ := json.Marshal(SubmissionMsg{s.ID, s.Key.Agent, s.Key.Instance, s.Key.Session})
		f, err := r.js.PublishAsync(r.ns.submitSubject(s.Key.Agent), data, jetstream.WithMsgID(msgID(s)))
		if err != nil {
			errs = append(errs, err)
			break
		}
		futures = append(futures, f)
	}
	acked := make([]string, 0, len(futures))
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
wait:
	for i, f := range futures {
		select {
		case <-f.Ok():
			acked = append(acked, subs[i].ID)
		case err := <-f.Err():
			errs = append(errs, err)
		case <-deadline.C:
			errs = append(errs, errors.New("no publish ack within 10s"))
			break wait
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
			break wait
		}
	}
	if len(acked) > 0 {
		// Not ctx: once JetStream has them, recording that must not be
		// skipped because we are stopping.
		if err := r.log.MarkPublished(context.WithoutCancel(ctx), acked...); err != nil {
			errs = append(errs, err)
		}
	}
	return len(subs), errors.Join(errs...)
}
