package transport_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

var streamKey = record.Key{Agent: "echo", Instance: "i1", Session: "default"}

func TestStreamReplayThenTail(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	a1, err := e.db.Append(ctx, streamKey, userText("one"), assistantText("two"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := e.db.Append(ctx, streamKey, userText("three"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The stream opens with a comment, before any record.
	f, err := r.Next()
	if err != nil || f.Comment != "connected" {
		t.Fatalf("first frame %+v %v", f, err)
	}
	for _, want := range []struct {
		a     log.Appended
		texts []string
	}{{a1, []string{"one", "two"}}, {a2, []string{"three"}}} {
		f := nextData(t, r)
		if f.Type != wire.FrameConversation || f.BatchOffset != want.a.Offset || f.NextOffset != want.a.NextOffset ||
			f.ID != string(want.a.NextOffset) || f.Incarnation != want.a.Incarnation || len(f.Records) != len(want.texts) {
			t.Fatalf("frame %+v, want batch %+v", f, want.a)
		}
		for i, text := range want.texts {
			if got := textOf(t, f.Records[i]); got != text {
				t.Errorf("record %d %q, want %q", i, got, text)
			}
		}
	}

	// Live: an append while the client waits reaches it.
	a3, err := e.db.Append(ctx, streamKey, assistantText("live"))
	if err != nil {
		t.Fatal(err)
	}
	f = nextData(t, r)
	if f.BatchOffset != a3.Offset || f.ID != string(a3.NextOffset) || textOf(t, f.Records[0]) != "live" {
		t.Fatalf("live frame %+v", f)
	}
	if r.LastEventID() != string(a3.NextOffset) {
		t.Errorf("LastEventID %q", r.LastEventID())
	}
}

func TestStreamHeaders(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.ts.URL+"/agents/echo/i1/stream", nil)
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for k, want := range map[string]string{
		"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
	} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != ": connected\n" {
		t.Fatalf("first line %q %v", line, err)
	}
}

// TestStreamFrameGolden pins the exact bytes of a conversation frame.
func TestStreamFrameGolden(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	if _, err := e.db.Append(ctx, streamKey, userText("hello <world> & \"you\""), assistantText("hi\nthere")); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", e.ts.URL+"/agents/echo/i1/stream?offset=0", nil)
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var frame bytes.Buffer
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, ":") || (line == "\n" && frame.Len() == 0) {
			continue
		}
		frame.WriteString(line)
		if line == "\n" {
			break
		}
	}
	golden(t, "sse_conversation_frame.txt", frame.Bytes())
}

func TestStreamDeltas(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	a, err := e.db.Append(ctx, streamKey, userText("q"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.c.Stream(ctx, "echo", "i1", "default", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if f := nextData(t, r); f.Type != wire.FrameConversation {
		t.Fatalf("frame %+v", f)
	}
	// Subscribed before the headers were sent.
	if n := e.hub.subscribers(streamKey); n != 1 {
		t.Fatalf("%d delta subscribers", n)
	}
	e.hub.publish(record.Key{Agent: "echo", Instance: "i1", Session: "other"}, `{"type":"delta","text":"not ours"}`)
	e.hub.publish(streamKey, `{"type":"delta","text":"tok"}`)
	e.hub.publish(streamKey, "{\"type\":\"toolcall_delta\",\n\"args\":\"{\\\"a\\\"\"}")
	f := nextData(t, r)
	if f.Type != "delta" || f.ID != "" || string(f.Raw) != `{"type":"delta","text":"tok"}` {
		t.Fatalf("delta frame %+v", f)
	}
	// A frame with a line break arrives whole, split over data lines.
	f = nextData(t, r)
	if f.Type != "toolcall_delta" || f.ID != "" || string(f.Raw) != "{\"type\":\"toolcall_delta\",\n\"args\":\"{\\\"a\\\"\"}" {
		t.Fatalf("multi-line delta %+v %q", f, f.Raw)
	}
	// Deltas are not positions: the resume point is still the last batch's.
	if r.LastEventID() != string(a.NextOffset) {
		t.Errorf("LastEventID %q after deltas", r.LastEventID())
	}
	// And records still follow.
	if _, err := e.db.Append(ctx, streamKey, assistantText("done")); err != nil {
		t.Fatal(err)
	}
	if f := nextData(t, r); f.Type != wire.FrameConversation || textOf(t, f.Records[0]) != "done" {
		t.Fatalf("frame after deltas %+v", f)
	}
}

// A reader too slow for the deltas loses deltas, never records, and never
// blocks the publisher.
func TestStreamDeltasDropWhenSlow(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	big := `{"type":"delta","text":"` + strings.Repeat("x", 32<<10) + `"}`
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 5000; i++ {
			e.hub.publish(streamKey, big)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("publishing deltas blocked on a slow reader")
	}
	// Some got through before the records change (the handler drained
	// them while the publisher ran).
	if f := nextData(t, r); f.Type != "delta" {
		t.Fatalf("first frame %+v", f)
	}
	deltas := 1
	a, err := e.db.Append(ctx, streamKey, assistantText("kept"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		f := nextData(t, r)
		if f.Type == wire.FrameConversation {
			if f.BatchOffset != a.Offset || textOf(t, f.Records[0]) != "kept" {
				t.Fatalf("frame %+v", f)
			}
			break
		}
		deltas++
	}
	if deltas >= 5000 {
		t.Errorf("all %d deltas arrived; want some dropped", deltas)
	}
}

func TestStreamHeartbeat(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.Heartbeat = 50 * time.Millisecond })
	ctx := testCtx(t)
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start := time.Now()
	beats := 0
	for beats < 3 {
		f, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch f.Comment {
		case "connected":
		case "keepalive":
			beats++
		default:
			t.Fatalf("unexpected frame %+v", f)
		}
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("3 heartbeats in %v with a 50ms period", d)
	}
}

// Resuming with Last-Event-ID continues exactly after the last frame read:
// nothing lost, nothing repeated.
func TestStreamResumeLastEventID(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	var sent []string
	appendText := func(texts ...string) {
		t.Helper()
		recs := make([]record.Record, len(texts))
		for i, s := range texts {
			recs[i] = userText(s)
		}
		if _, err := e.db.Append(ctx, streamKey, recs...); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, texts...)
	}
	appendText("a")
	appendText("b", "c")
	appendText("d")

	var got []string
	collect := func(f client.Frame) {
		for _, rec := range f.Records {
			got = append(got, textOf(t, rec))
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	r, err := e.c.Stream(sctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	collect(nextData(t, r))
	collect(nextData(t, r))
	last := r.LastEventID()
	cancel()
	r.Close()
	e.waitIdle(t)

	appendText("e")
	appendText("f", "g")

	r, err = e.c.Resume(ctx, "echo", "i1", "", last)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	first := nextData(t, r)
	if string(first.BatchOffset) != last {
		t.Fatalf("resumed at %s, want %s", first.BatchOffset, last)
	}
	collect(first)
	collect(nextData(t, r))
	collect(nextData(t, r))
	// A marker proves nothing else was queued before it.
	appendText("marker")
	collect(nextData(t, r))
	if strings.Join(got, "") != strings.Join(sent, "") {
		t.Fatalf("read %v, want %v", got, sent)
	}

	// Last-Event-ID takes the place of the offset parameter.
	req, _ := http.NewRequestWithContext(ctx, "GET", e.ts.URL+"/agents/echo/i1/stream?offset=0", nil)
	req.Header.Set("Last-Event-ID", last)
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sr := client.NewStreamReader(resp.Body)
	defer sr.Close()
	if f := nextData(t, sr); string(f.BatchOffset) != last {
		t.Fatalf("Last-Event-ID ignored: frame at %s", f.BatchOffset)
	}
}

// A client that goes away frees its handler and its subscriptions at once.
func TestStreamClientGoesAway(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	if f, err := r.Next(); err != nil || f.Comment != "connected" {
		t.Fatalf("%+v %v", f, err)
	}
	if e.srv.OpenStreams() != 1 || e.hub.subscribers(streamKey) != 1 {
		t.Fatalf("streams %d, subscribers %d", e.srv.OpenStreams(), e.hub.subscribers(streamKey))
	}
	cancel()
	r.Close()
	e.waitIdle(t)
	if n := e.hub.subscribers(streamKey); n != 0 {
		t.Errorf("%d delta subscriptions left", n)
	}
	// The stream still works for the next reader.
	if _, err := e.db.Append(testCtx(t), streamKey, userText("after")); err != nil {
		t.Fatal(err)
	}
}

func TestStreamReset(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	for _, regrow := range []bool{false, true} {
		t.Run(fmt.Sprint("regrow=", regrow), func(t *testing.T) {
			// A session of its own: each case starts from an empty stream.
			streamKey := record.Key{Agent: "echo", Instance: "i1", Session: fmt.Sprint("regrow-", regrow)}
			if _, err := e.db.Append(ctx, streamKey, userText("old")); err != nil {
				t.Fatal(err)
			}
			r, err := e.c.Stream(ctx, "echo", "i1", streamKey.Session, record.Start)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			f := nextData(t, r)
			if f.Type != wire.FrameConversation {
				t.Fatalf("%+v", f)
			}
			if regrow {
				// Case two: after the reset the stream regrows past the
				// reader's offset, which is valid again in the new
				// incarnation; only the incarnation tells.
				if _, err := e.db.Append(ctx, streamKey, userText("x")); err != nil {
					t.Fatal(err)
				}
				nextData(t, r)
			}
			inc, err := e.db.Reset(ctx, streamKey)
			if err != nil {
				t.Fatal(err)
			}
			if regrow {
				if _, err := e.db.Append(ctx, streamKey, userText("n1"), userText("n2")); err != nil {
					t.Fatal(err)
				}
			}
			var fe client.Frame
			for {
				fe, err = r.Next()
				if err != nil || fe.Comment == "" {
					break
				}
			}
			// A reset frame with id 0 and the new incarnation; the stream
			// goes on from the start of the new incarnation.
			if err != nil || fe.Type != transport.FrameReset || fe.ID != "0" || !strings.Contains(string(fe.Raw), `"incarnation":"`+string(inc)+`"`) {
				t.Fatalf("after reset: frame %+v err %v, want a reset frame with %s", fe, err, inc)
			}
			if !regrow {
				golden(t, "sse_reset_frame.txt", []byte(fmt.Sprintf("id: %s\ndata: %s\n\n", fe.ID, fe.Raw)))
				if _, err := e.db.Append(ctx, streamKey, userText("n1")); err != nil {
					t.Fatal(err)
				}
			}
			f = nextData(t, r)
			if f.Type != wire.FrameConversation || f.Incarnation != inc || f.BatchOffset != record.Start {
				t.Fatalf("after the reset frame: %+v", f)
			}
			r.Close()
			e.waitIdle(t)
		})
	}
}

func TestStreamBadOffsets(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	a, err := e.db.Append(ctx, streamKey, userText("a"), userText("b"))
	if err != nil {
		t.Fatal(err)
	}
	// Malformed: a plain 400 before the stream starts.
	for _, q := range []string{"offset=x", "offset=-3", "session=a%20b"} {
		status, h, b := e.do(t, "GET", "/agents/echo/i1/stream?"+q, nil, nil)
		if status != 400 || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
			t.Errorf("%s: %d %s", q, status, b)
		}
	}
	status, _, b := e.do(t, "GET", "/agents/echo/i1/stream", nil, map[string]string{"Last-Event-ID": "nope"})
	if status != 400 || errorOf(t, b)["code"] != "invalid_offset" {
		t.Errorf("bad Last-Event-ID: %d %s", status, b)
	}
	if _, err := e.c.Stream(ctx, "ghost", "i1", "", ""); !client.IsCode(err, wire.CodeNotFound) {
		t.Errorf("unknown agent: %v", err)
	}
	// Well-formed but never produced: a plain 400 with the incarnation,
	// before the stream opens (an EventSource stops on it, where an error
	// frame would make it reconnect forever).
	_, err = e.c.Stream(ctx, "echo", "i1", "", "1")
	var ae *wire.APIError
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Code != wire.CodeUnknownOffset || ae.Incarnation != a.Incarnation {
		t.Fatalf("unknown offset: %v", err)
	}
}

// A reader far behind catches up page by page, in order.
func TestStreamCatchUp(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	const batches, per = 30, 100 // 3000 records: three pages
	for i := 0; i < batches; i++ {
		recs := make([]record.Record, per)
		for j := range recs {
			recs[j] = userText(fmt.Sprint(i*per + j))
		}
		if _, err := e.db.Append(ctx, streamKey, recs...); err != nil {
			t.Fatal(err)
		}
	}
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	prev := record.Start
	for i := 0; i < batches; i++ {
		f := nextData(t, r)
		if f.BatchOffset != prev {
			t.Fatalf("frame %d at %s, want %s", i, f.BatchOffset, prev)
		}
		prev = f.NextOffset
		for _, rec := range f.Records {
			if got := textOf(t, rec); got != fmt.Sprint(n) {
				t.Fatalf("record %d is %q", n, got)
			}
			n++
		}
	}
	if n != batches*per {
		t.Fatalf("%d records", n)
	}
}

func TestStreamEndsOnShutdownAndClose(t *testing.T) {
	t.Run("shutdown", func(t *testing.T) {
		e := newEnv(t)
		ctx := testCtx(t)
		r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		nextComment(t, r)
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := e.srv.Shutdown(sctx); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("after shutdown: %v", err)
		}
	})
	t.Run("log closed", func(t *testing.T) {
		e := newEnv(t)
		ctx := testCtx(t)
		r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		nextComment(t, r)
		if err := e.db.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("after close: %v", err)
		}
	})
	t.Run("deltas unavailable", func(t *testing.T) {
		e := newEnv(t)
		e.hub.fail = errors.New("no deltas today")
		ctx := testCtx(t)
		if _, err := e.db.Append(ctx, streamKey, userText("still served")); err != nil {
			t.Fatal(err)
		}
		r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if f := nextData(t, r); textOf(t, f.Records[0]) != "still served" {
			t.Fatalf("%+v", f)
		}
	})
}

func nextComment(t *testing.T, r *client.StreamReader) {
	t.Helper()
	if f, err := r.Next(); err != nil || f.Comment == "" {
		t.Fatalf("want a comment: %+v %v", f, err)
	}
}

// A live reader that falls more than MaxLag records behind the tail gets a
// final reader_too_slow frame naming its resume offset, and loses nothing
// by resuming from it.
func TestStreamReaderTooSlow(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.MaxLag = 10 })
	ctx := testCtx(t)
	if _, err := e.db.Append(ctx, streamKey, userText("start")); err != nil {
		t.Fatal(err)
	}
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var seen []record.Offset
	f := nextData(t, r) // the tail: the reader is live
	seen = append(seen, f.BatchOffset)

	// The reader stops taking bytes while 100,000 records (about 20 MB,
	// more than loopback socket buffers hold) are appended: the server
	// blocks on its write, and finds itself far behind when it can write
	// again.
	batch := make([]record.Record, 1000)
	for range 100 {
		for i := range batch {
			batch[i] = userText("a record of some size, so that pages fill socket buffers quickly")
		}
		if _, err := e.db.Append(ctx, streamKey, batch...); err != nil {
			t.Fatal(err)
		}
	}
	var slow *wire.APIError
	for slow == nil {
		f, err := r.Next()
		switch {
		case errors.As(err, &slow):
		case err != nil:
			t.Fatalf("stream ended without reader_too_slow: %v", err)
		case f.Type == wire.FrameConversation:
			seen = append(seen, f.BatchOffset)
		}
	}
	if slow.Code != wire.CodeReaderTooSlow || slow.Offset == "" || string(slow.Offset) != r.LastEventID() {
		t.Fatalf("final frame %+v, last event id %q", slow, r.LastEventID())
	}
	// Resume from the offset it named: every batch exactly once.
	resumed, err := e.c.Resume(ctx, "echo", "i1", "", string(slow.Offset))
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	_, tail, _ := e.db.Tail(ctx, streamKey)
	next := slow.Offset
	for next != tail {
		f, err := resumed.Next()
		if err != nil {
			t.Fatalf("resumed stream: %v", err)
		}
		if f.Type != wire.FrameConversation {
			continue
		}
		if f.BatchOffset != next {
			t.Fatalf("resumed at %s, want %s", f.BatchOffset, next)
		}
		seen = append(seen, f.BatchOffset)
		next = f.NextOffset
	}
	all, err := e.db.Read(ctx, streamKey, record.Start, log.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	off := record.Start
	var want []record.Offset
	for {
		for _, b := range all.Batches {
			want = append(want, b.Offset)
		}
		if all.UpToDate {
			break
		}
		off = all.NextOffset
		if all, err = e.db.Read(ctx, streamKey, off, log.MaxReadLimit); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("batches seen across the disconnect:\n got %v\nwant %v", seen, want)
	}
}

// A burst of deltas and the records that follow arrive whole and in
// order: deltas first, then the records, and the stream goes on.
func TestStreamBurst(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if f, err := r.Next(); err != nil || f.Comment != "connected" {
		t.Fatalf("%+v %v", f, err)
	}
	for turn := range 3 {
		for i := range 12 { // within the hub's window
			e.hub.publish(streamKey, fmt.Sprintf(`{"type":"delta","delta":"%d.%d"}`, turn, i))
		}
		a, err := e.db.Append(ctx, streamKey, assistantText(fmt.Sprint("reply ", turn)))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 12 { // within the hub's window
			f := nextData(t, r)
			if want := fmt.Sprintf(`{"type":"delta","delta":"%d.%d"}`, turn, i); f.Type != "delta" || string(f.Raw) != want {
				t.Fatalf("turn %d delta %d: %+v, want %s", turn, i, f, want)
			}
		}
		if f := nextData(t, r); f.Type != wire.FrameConversation || f.BatchOffset != a.Offset {
			t.Fatalf("turn %d: %+v, want the batch at %s", turn, f, a.Offset)
		}
	}
}

// What a wake-up window brings leaves in one write: with the log holding
// a conversation's wake-ups (log.Options.WakeDelay, as the service sets
// WakeDelay for busy conversations), three commits reach the reader as
// three frames of one socket write.
func TestStreamWritesAWindowOnce(t *testing.T) {
	const window = 300 * time.Millisecond
	e := newEnvLog(t, &log.Options{WakeDelay: func(int) time.Duration { return window }})
	ctx := testCtx(t)
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if f, err := r.Next(); err != nil || f.Comment != "connected" {
		t.Fatalf("%+v %v", f, err)
	}
	first, err := e.db.Append(ctx, streamKey, assistantText("first"))
	if err != nil {
		t.Fatal(err)
	}
	if f := nextData(t, r); f.BatchOffset != first.Offset {
		t.Fatalf("%+v, want the batch at %s", f, first.Offset)
	}
	before, _ := e.srv.StreamWrites()
	began := time.Now()
	var offsets []record.Offset
	for i := range 3 {
		a, err := e.db.Append(ctx, streamKey, assistantText(fmt.Sprint("reply ", i)))
		if err != nil {
			t.Fatal(err)
		}
		offsets = append(offsets, a.Offset)
	}
	inWindow := time.Since(began) < window
	for i, want := range offsets {
		if f := nextData(t, r); f.Type != wire.FrameConversation || f.BatchOffset != want {
			t.Fatalf("frame %d: %+v, want the batch at %s", i, f, want)
		}
	}
	after, _ := e.srv.StreamWrites()
	if inWindow && after-before != 1 {
		t.Fatalf("three commits of one window took %d writes, want 1", after-before)
	}
	if after-before < 1 || after-before > 3 {
		t.Fatalf("%d writes for three frames", after-before)
	}
}

// A conversation deleted (or reset) after a reader connected but before
// its first page still ends (or resets) that reader: the stream existed
// when it connected. Before, such a reader waited forever on a
// conversation it took for one not yet begun (TestLifecycleAbortsRunningTurn
// timed out on it under load).
func TestStreamChangedBeforeFirstPage(t *testing.T) {
	for _, kind := range []log.ChangeKind{log.ChangeDelete, log.ChangeReset} {
		t.Run(string(kind), func(t *testing.T) {
			e := newEnv(t)
			ctx := testCtx(t)
			key := record.Key{Agent: "echo", Instance: "i1", Session: "default"}
			if _, err := e.db.Append(ctx, key, userText("one")); err != nil {
				t.Fatal(err)
			}
			opened, proceed := make(chan struct{}), make(chan struct{})
			defer transport.SetStreamOpenedHook(func() { close(opened); <-proceed })()
			r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			<-opened
			if _, _, err := e.db.Change(ctx, log.Change{Kind: kind, Key: key}); err != nil {
				t.Fatal(err)
			}
			close(proceed)
			want := transport.FrameEnded
			if kind == log.ChangeReset {
				want = transport.FrameReset
			}
			if f := nextData(t, r); f.Type != want {
				t.Fatalf("first frame %+v, want %s", f, want)
			}
		})
	}
}
