package transport

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"
)

// streamPageLimit is the page the SSE handler reads at a time: bounded, so
// that a reader far behind never makes the log copy its whole history at
// once.
const streamPageLimit = log.DefaultReadLimit

// stream is GET /agents/:name/:instanceId/stream: Server-Sent Events that
// replay the stream from an offset (the Last-Event-ID header, else the
// offset parameter) and then tail it, interleaving the live presentation
// frames of running turns.
//
// It is one goroutine, the handler's: it reads a page (log.Read copies it
// out and closes its transaction), writes it, and when up to date waits in
// a single select on the log, the deltas, the heartbeat, the client and
// shutdown. Nothing is held while it writes or waits.
func (s *Server) stream(c echo.Context) error {
	agent, instance, err := s.instance(c)
	if err != nil {
		return err
	}
	key, err := sessionKey(c, agent, instance)
	if err != nil {
		return err
	}
	req := c.Request()
	var offset record.Offset
	if id := req.Header.Get("Last-Event-ID"); id != "" {
		offset, err = parseOffset(id)
	} else {
		offset, err = queryOffset(c)
	}
	if err != nil {
		return err
	}
	ndjson, err := negotiateStream(req.Header.Values(echo.HeaderAccept))
	if err != nil {
		return err
	}
	ctx := req.Context()
	// Each stream holds a connection, a descriptor, for as long as its
	// reader stays: capped, so that idle readers cannot take the
	// descriptors that deliveries, health checks and the log need.
	endStream, err := s.beginStream(c)
	if err != nil {
		return err
	}
	// What the stream holds is let go when it ends: here, or in the
	// stream's own goroutine once it has taken the connection.
	var deltas DeltaCursor
	detached := false
	defer func() {
		if !detached {
			endStream()
			if deltas != nil {
				deltas.Close()
			}
		}
	}()
	// An offset this stream never produced is refused before the stream
	// opens, with a plain 400: an EventSource gives up on a non-200, where
	// an error frame in a 200 would make it reconnect in a loop.
	// What it finds is the incarnation the reader connected to: a delete
	// or a reset before the stream's first page is still an end or a
	// reset to this reader, not a conversation that never was.
	opened, err := s.db.Read(ctx, key, offset, 1)
	if err != nil {
		return err
	}

	// Deltas first, so that none of a turn that is running while we catch
	// up is missed for want of a cursor (they may be skipped for want of
	// room, which is their contract).
	if s.opts.Deltas != nil {
		cur, err := s.opts.Deltas.FollowDeltas(key)
		if err != nil {
			// Deltas only add interactivity: serve the durable stream
			// without them rather than fail it.
			s.log.WarnContext(ctx, "following deltas", "key", key.String(), "err", err)
		} else {
			deltas = cur
		}
	}

	res := c.Response()
	h := res.Header()
	if ndjson {
		h.Set(echo.HeaderContentType, mimeNDJSON)
	} else {
		h.Set(echo.HeaderContentType, "text/event-stream")
	}
	h.Set(echo.HeaderCacheControl, "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Add(echo.HeaderVary, echo.HeaderAccept)
	principal, _ := PrincipalOf(c)
	path := req.URL.Path
	// The stream takes its connection from net/http, and the request's
	// goroutine returns: an open stream then costs one goroutine of its
	// own, with a small stack, and a reading goroutine, instead of
	// net/http's request machinery (a grown handler stack, buffers, a
	// background reader) for as long as the reader stays.
	if conn, err := s.hijackStream(res.Writer, h); err == nil {
		detached = true
		s.inflight.add(1) // Shutdown waits for the stream, as for a request
		go func() {
			defer s.inflight.add(-1)
			defer endStream()
			if deltas != nil {
				defer deltas.Close()
			}
			ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			defer cancel()
			read := watchPeer(conn, cancel)
			defer func() {
				conn.Close()
				<-read
			}()
			w := &sseWriter{w: conn, rc: hijacked{conn}, timeout: s.opts.WriteTimeout, ndjson: ndjson, frames: &s.frames, counters: &s.written}
			defer w.release()
			s.tail(ctx, w, key, opened.Incarnation, offset, deltas, principal, path)
		}()
		return nil
	} else if !errors.Is(err, http.ErrNotSupported) {
		return nil // the connection failed while taking it: the client is gone
	}
	rc := http.NewResponseController(res.Writer)
	// The server's WriteTimeout, if any, is for ordinary requests; this one
	// lasts as long as the client stays, with a deadline per write instead
	// (sseWriter.flush sets it). Not every writer supports it.
	_ = rc.SetWriteDeadline(time.Time{})
	res.WriteHeader(http.StatusOK)
	w := &sseWriter{w: res, rc: rc, timeout: s.opts.WriteTimeout, ndjson: ndjson, frames: &s.frames, counters: &s.written}
	defer w.release()
	s.tail(ctx, w, key, opened.Incarnation, offset, deltas, principal, path)
	return nil
}

// testHookStreamOpened, set by a test, runs in a stream between its
// connected comment and its first page.
var testHookStreamOpened func()

// tail writes the stream from offset on to w until the client leaves, a
// write fails, the stream ends or the server stops: it reads a page (log
// copies it out and closes its transaction), writes it, and when up to
// date waits in a single select on the log, the deltas, the heartbeat,
// the client and shutdown. Nothing is held while it writes or waits.
func (s *Server) tail(ctx context.Context, w *sseWriter, key record.Key, inc record.Incarnation, offset record.Offset, deltas DeltaCursor, principal auth.Principal, path string) {
	// The client sees the stream open before the first record exists.
	w.comment("connected")
	if w.flush() != nil {
		return
	}
	heartbeat := time.NewTicker(s.opts.Heartbeat)
	defer heartbeat.Stop()
	// Shutdown ends the stream through its context: one channel less in
	// every wait of every stream.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.closingCtx, cancel)()
	// Followed once for the stream's life: re-arming after each write is
	// an atomic load, not a subscription.
	watch := s.db.Watch(key)
	defer watch.Close()
	if testHookStreamOpened != nil {
		testHookStreamOpened()
	}
	// inc is the incarnation served so far; "" until the stream exists.
	live := false // the reader has reached the tail once
	for {
		// Taken before reading: a commit between the read and the wait
		// still closes changed.
		changed := watch.Changed()
		// Small pages: a reader that stalls holds one until the write
		// deadline, and thousands of readers may.
		page, err := watch.Read(ctx, offset, streamPageLimit, s.opts.StreamPageBytes)
		if oe := (*log.OffsetError)(nil); err != nil && inc != "" && errors.Is(err, log.ErrUnknownOffset) {
			switch {
			case !errors.As(err, &oe):
				// The stream we served is gone: its instance was deleted.
				err, page = nil, record.ReadResult{}
			case oe.Incarnation != inc:
				// Reset, and our offset is past the new tail.
				err, page = nil, record.ReadResult{Incarnation: oe.Incarnation}
			}
		}
		if err != nil {
			s.endStream(ctx, path, w, err)
			return
		}
		if inc != "" && page.Incarnation == "" {
			w.endedFrame(inc)
			_ = w.flush()
			return
		}
		if page.Incarnation != "" {
			if inc != "" && page.Incarnation != inc {
				// Reset: say so, with id 0 so that a reconnect resumes in
				// the new incarnation, and go on from its start.
				w.resetFrame(inc, page.Incarnation)
				inc, offset = page.Incarnation, record.Start
				if w.flush() != nil {
					return
				}
				continue
			}
			inc = page.Incarnation
		}
		if len(page.Batches) > 4 {
			w.bulk()
		}
		for i, b := range page.Batches {
			// Within a page batches are contiguous, so a batch ends where
			// the next begins: no arithmetic on opaque offsets.
			next := page.NextOffset
			if i+1 < len(page.Batches) {
				next = page.Batches[i+1].Offset
			}
			w.conversation(inc, b, next)
		}
		offset = page.NextOffset
		if w.flush() != nil {
			return
		}
		if live && page.Remaining > uint64(s.opts.MaxLag) {
			// It takes records slower than they come: nothing piles up
			// here (the log is the buffer), but it would never catch up
			// live. Say so and let it resume from where it is.
			e := apiErr(0, wire.CodeReaderTooSlow, "this reader fell %d records behind the live tail (limit %d); resume from offset %s, or read by polling", page.Remaining, s.opts.MaxLag, offset)
			e.Offset = offset
			w.errorFrame(e)
			_ = w.flush()
			return
		}
		live = live || page.UpToDate
		if !page.UpToDate {
			if s.stopping(ctx) {
				return
			}
			continue
		}
		if !s.waitTail(ctx, w, changed, deltas, heartbeat.C, principal) {
			return
		}
	}
}

// waitTail waits, up to date, until the stream changes. Meanwhile it
// forwards deltas and heartbeats. It returns false when the stream must
// end: the client left, a write failed, the log closed or the server is
// shutting down (which cancels ctx).
//
// It writes what it has as soon as it wakes. Batching for many readers
// happens before the wake-up, where it costs nothing per reader: the log
// and the delta bus hold a busy conversation's wake-ups for a window
// (WakeDelay), so that ten thousand readers wake once for a turn's user
// message, deltas and reply, and each writes them in one write.
func (s *Server) waitTail(ctx context.Context, w *sseWriter, changed <-chan struct{}, deltas DeltaCursor, heartbeat <-chan time.Time, principal auth.Principal) bool {
	var frames [][]byte
	for {
		var ready <-chan struct{} // nil without a DeltaSource: never ready
		if deltas != nil {
			ready = deltas.Ready()
		}
		records := false
		select {
		case <-changed:
			records = true
		case <-ready:
		case <-heartbeat:
			if principal.Expired(time.Now()) {
				// The token that opened the stream has expired: say so,
				// and the client reconnects with a fresh one.
				w.errorFrame(&wire.APIError{Code: wire.CodeUnauthorized, Message: "the token that opened this stream has expired; reconnect with a new one"})
				w.flush()
				return false
			}
			w.comment("keepalive")
			if w.flush() != nil {
				return false
			}
			continue
		case <-ctx.Done():
			return false
		case <-s.db.Done():
			return false
		}
		// Deltas first: they come before the records of the same turn.
		if deltas != nil {
			frames = deltas.Next(frames[:0])
			for _, f := range frames {
				w.event("", f)
			}
			clear(frames)
		}
		if !records {
			select {
			case <-changed:
				records = true
			default:
			}
		}
		if records {
			return true // the caller writes the records and flushes all
		}
		if w.flush() != nil {
			return false
		}
	}
}

// WakeDelay is how long a commit's or a delta's wake-up of a conversation
// waits for what follows it, given how many wait on the conversation:
// nothing below DefaultCoalesceFrom waiters, then coalescePerWaiter per
// waiter up to coalesceMax. The service passes it to the log
// (log.Options.WakeDelay) and the delta bus. A write per reader per event
// costs a syscall each; with the window a turn's user message, deltas and
// reply leave in one write per reader, and a conversation with few readers
// pays no window for the many readers of others.
//
// The per-waiter figure was chosen by `make bench`'s fan-out rows: at
// 10,000 readers of one conversation, 3 µs (a 30 ms window) carried 1.04
// writes per reader per POST.
func WakeDelay(waiters int) time.Duration {
	if waiters < DefaultCoalesceFrom {
		return 0
	}
	return min(time.Duration(waiters)*coalescePerWaiter, coalesceMax)
}

const (
	coalescePerWaiter = 3 * time.Microsecond
	coalesceMax       = 50 * time.Millisecond
)

// stopping reports whether the stream should end between pages.
func (s *Server) stopping(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	select {
	case <-s.closing:
		return true
	case <-s.db.Done():
		return true
	default:
		return false
	}
}

// endStream reports a failed read in the stream, where the client can see
// it, unless the client is gone or the log closed (a reconnect elsewhere
// resumes from the last id).
func (s *Server) endStream(ctx context.Context, path string, w *sseWriter, err error) {
	if ctx.Err() != nil || errors.Is(err, log.ErrClosed) {
		return
	}
	e, internal := toAPIError(err)
	if internal {
		s.log.ErrorContext(ctx, "stream read failed", "path", path, "err", err)
	}
	w.errorFrame(e)
	_ = w.flush()
}
