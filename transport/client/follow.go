package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
	"github.com/convlog/convlog/transport/wire"
)

// Live is how Follow reads a conversation.
type Live string

// Live modes.
const (
	// LiveAuto reads by SSE and falls back to JSON polling for good when
	// SSE does not work (a proxy that answers something else than an event
	// stream, or streams that end before their first frame).
	LiveAuto Live = "auto"
	LiveSSE  Live = "sse"  // SSE only; failures are retried with SSE
	LivePoll Live = "poll" // JSON polling only; no presentation frames
)

// Defaults of FollowOptions.
const (
	DefaultIdleTimeout  = 90 * time.Second
	DefaultPollInterval = time.Second
	DefaultRetryMax     = 10 * time.Second
)

// FollowOptions tune Follow. The zero value follows the default session
// from the start, by SSE with polling as fallback.
type FollowOptions struct {
	Session string
	// Offset is where to start ("" is the start). After a reset it is
	// record.Start again.
	Offset record.Offset
	// Incarnation is the one Offset belongs to, when the caller resumes
	// from a position it saved: if the stream has another one now (it was
	// reset, or restored from a backup), Follow yields UpdateReset and
	// reads from the start instead of taking the new records at that
	// offset for the ones it knew.
	Incarnation record.Incarnation
	Live        Live
	// IdleTimeout is how long a stream may stay silent (no frame, no
	// keepalive) before the client drops it and reconnects from its last
	// event id. Default DefaultIdleTimeout; set it to a few heartbeats.
	IdleTimeout time.Duration
	// PollInterval is the wait between polls at the tail. Default
	// DefaultPollInterval.
	PollInterval time.Duration
	// RetryMax caps the backoff between reconnection attempts (it starts
	// at 100 ms and doubles). Default DefaultRetryMax.
	RetryMax time.Duration
	// Deltas asks for presentation frames (UpdateDelta) too.
	Deltas bool
}

// UpdateKind says what an Update carries.
type UpdateKind string

// Kinds of Update.
const (
	// UpdateBatch is one stored batch of records.
	UpdateBatch UpdateKind = "batch"
	// UpdateDelta is a presentation frame of a running turn: for a live
	// preview only, superseded by the turn's records.
	UpdateDelta UpdateKind = "delta"
	// UpdateReset says the stream's incarnation changed (a reset, a
	// restore): everything derived so far is void, and the batches that
	// follow are the new incarnation's, from the start.
	UpdateReset UpdateKind = "reset"
	// UpdateReconnecting says the connection was lost and the client is
	// reconnecting from its last offset; Err says why. Nothing is lost.
	UpdateReconnecting UpdateKind = "reconnecting"
	// UpdatePolling says the client gave up on SSE and polls from now on.
	UpdatePolling UpdateKind = "polling"
)

// Update is one step of Follow.
type Update struct {
	Kind        UpdateKind
	Incarnation record.Incarnation
	// Offset and NextOffset bound a batch; NextOffset is also where a
	// reconnection resumes.
	Offset, NextOffset record.Offset
	Records            []record.Record
	// Delta is the raw presentation frame (its "type" is in DeltaType).
	Delta     json.RawMessage
	DeltaType string
	// Err is why the client is reconnecting or polling.
	Err error
}

// errSSEUnusable marks an SSE failure that polling would not have.
var errSSEUnusable = errors.New("sse unusable")

// errIdle marks a stream dropped for silence.
var errIdle = errors.New("the stream was silent for the idle timeout")

// Follow reads a session's stream for as long as ctx lasts, implementing
// the protocol's client checklist: it resumes after any disconnection from
// the last offset (nothing lost, nothing repeated), drops a stream silent
// for IdleTimeout, falls back from SSE to polling (LiveAuto), and on an
// incarnation change or unknown_offset yields UpdateReset and re-reads from
// "0". The sequence ends when ctx ends (with no error) or on an error that
// retrying cannot mend (an unknown agent, a bad name: *wire.APIError).
func (c *Client) Follow(ctx context.Context, agent, instance string, opts FollowOptions) iter.Seq2[Update, error] {
	if opts.Live == "" {
		opts.Live = LiveAuto
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = DefaultRetryMax
	}
	if opts.Offset == "" {
		opts.Offset = record.Start
	}
	return func(yield func(Update, error) bool) {
		f := &follower{c: c, agent: agent, instance: instance, opts: opts, offset: opts.Offset, inc: opts.Incarnation,
			yield: yield, polling: opts.Live == LivePoll}
		f.run(ctx)
	}
}

type follower struct {
	c               *Client
	agent, instance string
	opts            FollowOptions
	offset          record.Offset
	inc             record.Incarnation // last seen; "" before the first batch
	polling         bool
	sseFailures     int // consecutive unusable SSE attempts
	yield           func(Update, error) bool
	stopped         bool
}

func (f *follower) emit(u Update) bool {
	if f.stopped {
		return false
	}
	if !f.yield(u, nil) {
		f.stopped = true
	}
	return !f.stopped
}

func (f *follower) run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for !f.stopped && ctx.Err() == nil {
		var progressed bool
		var err error
		if f.polling {
			progressed, err = f.poll(ctx)
		} else {
			progressed, err = f.stream(ctx)
		}
		if f.stopped || ctx.Err() != nil {
			return
		}
		var ae *wire.APIError
		switch {
		case err == nil:
		case errors.As(err, &ae) && ae.Code == wire.CodeUnknownOffset:
			if !f.reset(ae.Incarnation) {
				return
			}
			continue
		case errors.As(err, &ae) && ae.Code == wire.CodeReaderTooSlow:
			if ae.Offset != "" {
				f.offset = ae.Offset
			}
		case errors.As(err, &ae) && ae.Status >= 400 && ae.Status < 500 && ae.Status != http.StatusTooManyRequests &&
			!strings.HasPrefix(ae.Code, "http_"):
			f.yield(Update{}, err) // the request itself is wrong: retrying cannot help
			f.stopped = true
			return
		case errors.Is(err, errSSEUnusable):
			f.sseFailures++
			if f.opts.Live == LiveAuto && f.sseFailures >= 2 {
				f.polling = true
				if !f.emit(Update{Kind: UpdatePolling, NextOffset: f.offset, Err: err}) {
					return
				}
				continue
			}
		}
		if progressed {
			backoff = 100 * time.Millisecond
		}
		if err != nil && !f.emit(Update{Kind: UpdateReconnecting, NextOffset: f.offset, Incarnation: f.inc, Err: err}) {
			return
		}
		if err == nil && progressed {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, f.opts.RetryMax)
	}
}

// reset starts over from the start of the new incarnation.
func (f *follower) reset(inc record.Incarnation) bool {
	f.offset, f.inc = record.Start, ""
	return f.emit(Update{Kind: UpdateReset, Incarnation: inc, NextOffset: record.Start})
}

// batch yields one batch, after checking its incarnation: a batch of
// another incarnation than the last one's means the stream was replaced
// while we were away, and our offset may mean something else in it.
func (f *follower) batch(inc record.Incarnation, off, next record.Offset, recs []record.Record) (again bool) {
	if f.inc != "" && inc != f.inc {
		f.reset(inc)
		return false
	}
	f.inc, f.offset = inc, next
	return f.emit(Update{Kind: UpdateBatch, Incarnation: inc, Offset: off, NextOffset: next, Records: recs})
}

// stream follows one SSE connection until it ends. progressed says it
// delivered something, which resets the backoff.
func (f *follower) stream(ctx context.Context) (progressed bool, err error) {
	if f.inc != "" {
		// An event stream says its incarnation only with a batch: one
		// at the tail would not tell a reader resuming there that the
		// stream was replaced (reset, restored) while it was away. A
		// page of one record does, at once.
		page, err := f.c.Read(ctx, f.agent, f.instance, f.opts.Session, f.offset, 1)
		if err != nil {
			return false, err
		}
		if page.Incarnation != f.inc {
			f.reset(page.Incarnation)
			return true, nil
		}
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sr, err := f.c.Stream(sctx, f.agent, f.instance, f.opts.Session, f.offset)
	if err != nil {
		if sseRefused(err) {
			return false, fmt.Errorf("%w: %v", errSSEUnusable, err)
		}
		return false, err
	}
	defer sr.Close()
	// Silence: no frame, not even a keepalive, for IdleTimeout.
	idle := time.AfterFunc(f.opts.IdleTimeout, func() { cancel(errIdle) })
	defer idle.Stop()
	frames := 0
	for {
		fr, err := sr.Next()
		if err != nil {
			if cause := context.Cause(sctx); errors.Is(cause, errIdle) {
				return progressed, errIdle
			}
			if frames == 0 && errors.Is(err, io.EOF) {
				// Ended before even ": connected": something between us
				// and the server does not pass event streams.
				return false, fmt.Errorf("%w: the stream ended before its first frame", errSSEUnusable)
			}
			if errors.Is(err, io.EOF) {
				err = errors.New("the stream ended")
			}
			return progressed, err
		}
		idle.Reset(f.opts.IdleTimeout)
		frames++
		f.sseFailures = 0
		switch fr.Type {
		case wire.FrameConversation:
			progressed = true
			if !f.batch(fr.Incarnation, fr.BatchOffset, fr.NextOffset, fr.Records) {
				return true, nil // stopped, or reset: reconnect from "0"
			}
		case "":
			// a comment: keepalive or connected
		default:
			if f.opts.Deltas && !f.emit(Update{Kind: UpdateDelta, Incarnation: f.inc, Delta: fr.Raw, DeltaType: fr.Type}) {
				return true, nil
			}
		}
	}
}

// sseRefused tells an answer that says event streams do not pass (a
// proxy's 404, 405, 406 or 415 not in the API's shape, or a 200 that is
// not an event stream) from a passing failure (a 502 while the server
// restarts), which is retried with SSE.
func sseRefused(err error) bool {
	if errors.Is(err, ErrNotEventStream) {
		return true
	}
	var ae *wire.APIError
	if !errors.As(err, &ae) || !strings.HasPrefix(ae.Code, "http_") {
		return false
	}
	switch ae.Status {
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotAcceptable, http.StatusUnsupportedMediaType:
		return true
	}
	return false
}

// poll reads pages until the tail, then waits PollInterval. It returns
// after one wait so that the caller's loop stays in charge.
func (f *follower) poll(ctx context.Context) (progressed bool, err error) {
	for {
		res, err := f.c.Read(ctx, f.agent, f.instance, f.opts.Session, f.offset, 0)
		if err != nil {
			return progressed, err
		}
		if res.Incarnation != "" && f.inc != "" && res.Incarnation != f.inc {
			f.reset(res.Incarnation)
			return true, nil
		}
		for _, b := range res.Batches {
			recs, err := b.Records.Decode()
			if err != nil {
				return progressed, fmt.Errorf("transport: decoding a page: %w", err)
			}
			// The page's batches are contiguous: each ends where the
			// next starts.
			next := nextBatchOffset(res, b.Offset)
			progressed = true
			if !f.batch(res.Incarnation, b.Offset, next, recs) {
				return true, nil
			}
		}
		f.offset = res.NextOffset
		if res.Incarnation != "" {
			f.inc = res.Incarnation
		}
		if !res.UpToDate {
			continue
		}
		select {
		case <-ctx.Done():
			return progressed, nil
		case <-time.After(f.opts.PollInterval):
		}
		return true, nil
	}
}

func nextBatchOffset(res record.ReadResult, off record.Offset) record.Offset {
	for i, b := range res.Batches {
		if b.Offset == off && i+1 < len(res.Batches) {
			return res.Batches[i+1].Offset
		}
	}
	return res.NextOffset
}

// ConversationState is the projected view of a conversation at one point.
type ConversationState struct {
	projection.View
	Incarnation record.Incarnation
	// NextOffset is where the records in the view end.
	NextOffset record.Offset
	// Reconnecting is set while the client is reconnecting; Err says why.
	Reconnecting bool
	Err          error
	// Preview holds the presentation frames of running turns received
	// since the last batch, for a live preview; empty when Deltas is off.
	Preview []json.RawMessage
}

// Conversation follows a session as Follow does and yields its projected
// view after every batch (and on reconnections and previews): the
// projection of projection.Project over every record of the current
// incarnation, truncations applied. On an incarnation change it starts
// over from an empty view.
func (c *Client) Conversation(ctx context.Context, agent, instance string, opts FollowOptions) iter.Seq2[ConversationState, error] {
	opts.Offset, opts.Incarnation = record.Start, "" // a view needs every record
	return func(yield func(ConversationState, error) bool) {
		p := projection.NewProjector()
		var st ConversationState
		for u, err := range c.Follow(ctx, agent, instance, opts) {
			if err != nil {
				yield(ConversationState{}, err)
				return
			}
			switch u.Kind {
			case UpdateReset:
				p = projection.NewProjector()
				st = ConversationState{Incarnation: u.Incarnation, NextOffset: record.Start}
				continue // the new incarnation's batches follow
			case UpdateBatch:
				p.Apply(u.Records...)
				st.Incarnation, st.NextOffset = u.Incarnation, u.NextOffset
				st.Reconnecting, st.Err, st.Preview = false, nil, nil
			case UpdateReconnecting:
				st.Reconnecting, st.Err = true, u.Err
			case UpdateDelta:
				st.Preview = append(st.Preview, u.Delta)
			default:
				continue
			}
			st.View = p.View()
			if !yield(st, nil) {
				return
			}
		}
	}
}
