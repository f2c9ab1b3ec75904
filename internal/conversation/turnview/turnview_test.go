package turnview_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/internal/conversation/turnview"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// memLog is a Log of one conversation held in memory: offset n is after
// its n-th batch.
type memLog struct {
	mu      sync.Mutex
	inc     record.Incarnation
	batches [][]record.Record
	sub     record.Submission
	changed chan struct{}
	done    chan struct{}
}

func newMemLog(sub record.Submission) *memLog {
	return &memLog{inc: "inc_1", sub: sub, changed: make(chan struct{}), done: make(chan struct{})}
}

func (m *memLog) Read(_ context.Context, _ record.Key, offset record.Offset, limit int) (record.ReadResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pos, err := strconv.Atoi(string(offset))
	if err != nil || pos > len(m.batches) {
		return record.ReadResult{}, log.ErrUnknownOffset
	}
	res := record.ReadResult{Incarnation: m.inc, Batches: []record.Batch{}, NextOffset: offset, UpToDate: true}
	for n := pos; n < len(m.batches); n++ {
		if len(res.Batches) == limit {
			res.UpToDate = false
			break
		}
		raw, err := json.Marshal(m.batches[n])
		if err != nil {
			return record.ReadResult{}, err
		}
		res.Batches = append(res.Batches, record.Batch{Offset: record.Offset(strconv.Itoa(n)), Count: len(m.batches[n]), Records: raw})
		res.NextOffset = record.Offset(strconv.Itoa(n + 1))
	}
	return res, nil
}

func (m *memLog) Submission(_ context.Context, id string) (record.Submission, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id != m.sub.ID {
		return record.Submission{}, log.ErrSubmissionNotFound
	}
	return m.sub, nil
}

func (m *memLog) Changed(record.Key) (<-chan struct{}, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed, func() {}
}

func (m *memLog) Done() <-chan struct{} { return m.done }

// append commits a batch and wakes the waiters.
func (m *memLog) append(recs ...record.Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches = append(m.batches, recs)
	close(m.changed)
	m.changed = make(chan struct{})
}

// reset starts a new incarnation.
func (m *memLog) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inc = "inc_2"
	close(m.changed)
	m.changed = make(chan struct{})
}

// frames is a Deltas cursor tests publish to.
type frames struct {
	mu    sync.Mutex
	queue [][]byte
	ready chan struct{}
	nexts int // calls of Next
}

func newFrames() *frames { return &frames{ready: make(chan struct{})} }

func (f *frames) Ready() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready
}

func (f *frames) Next(dst [][]byte) [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	dst = append(dst, f.queue...)
	f.queue = nil
	f.nexts++
	f.ready = make(chan struct{})
	return dst
}

func (f *frames) publish(t *testing.T, fr wire.DeltaFrame) {
	t.Helper()
	b, err := json.Marshal(fr)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = append(f.queue, b)
	close(f.ready)
	f.ready = make(chan struct{})
}

// sink records the events as short strings.
type sink struct {
	mu        sync.Mutex
	events    []string
	flushes   int
	keepalive int
	flushErr  error
}

func (s *sink) Emit(ev turnview.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var e string
	switch ev.Op {
	case turnview.OpStart:
		e = "start " + ev.Sub.ID
	case turnview.OpPartStart, turnview.OpPartEnd:
		e = fmt.Sprintf("%s %s %s", ev.Op, ev.Kind, ev.ID)
	case turnview.OpPartDelta:
		e = fmt.Sprintf("%s %s %s %q", ev.Op, ev.Kind, ev.ID, ev.Delta)
	case turnview.OpToolCall:
		e = fmt.Sprintf("%s %s %s %s", ev.Op, ev.ID, ev.ToolName, ev.Input)
	case turnview.OpToolResult:
		e = fmt.Sprintf("%s %s %s %s %v", ev.Op, ev.ID, ev.ToolName, ev.Output, ev.IsError)
	case turnview.OpFinish:
		e = fmt.Sprintf("%s %s %v", ev.Op, ev.Outcome, ev.Failure)
	case turnview.OpInputRequired:
		e = string(ev.Op)
		for _, r := range ev.Requests {
			e += " " + r.ApprovalID + "/" + r.ToolCallID
		}
	}
	s.events = append(s.events, e)
}

func (s *sink) Keepalive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepalive++
}

func (s *sink) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes++
	return s.flushErr
}

func (s *sink) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

// has waits until the sink's events are want.
func (s *sink) has(t *testing.T, want ...string) {
	t.Helper()
	check.For(t, 10*time.Second, time.Millisecond, func() error {
		if got := s.got(); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		return nil
	})
}

var key = record.Key{Agent: "a", Instance: "i", Session: record.DefaultSession}

func entry(typ, sub, turn string, payload any) record.Record {
	b, err := json.Marshal(payload)
	if err != nil {
		panic(err)
	}
	return record.EntryRecord(record.Entry{ID: "e" + strconv.Itoa(int(time.Now().UnixNano()%1e9)), Type: typ, SubmissionID: sub, TurnID: turn, Payload: b})
}

func assistant(turn string, parts ...record.Part) record.Record {
	return entry(record.EntryAssistantMessage, "s1", turn, record.MessagePayload{Parts: parts})
}

func settled(sub string, o record.Outcome, f *record.Failure) record.Record {
	return entry(record.EntrySettlement, sub, "t1", record.Settlement{SubmissionID: sub, Outcome: o, Error: f})
}

func text(s string) record.Part { return record.Part{Type: record.PartText, Text: s} }

func delta(turn, kind, s string) wire.DeltaFrame {
	return wire.DeltaFrame{Type: wire.FrameDelta, TurnID: turn, SubmissionID: "s1", Kind: kind, Delta: s}
}

func config(l turnview.Log) turnview.Config {
	return turnview.Config{Log: l, Heartbeat: time.Hour}
}

// run starts v.Run and returns its result's channel.
func run(v *turnview.View) <-chan error {
	done := make(chan error, 1)
	go func() { done <- v.Run(context.Background()) }()
	return done
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the view did not end")
		return nil
	}
}

// applied waits until the view has applied the frames published to f: it
// takes frames and then reads the log once per round, and flushes k at
// the round's end, so once it has flushed as many rounds as it took
// frames, it has applied them.
func applied(t *testing.T, f *frames, k *sink) {
	t.Helper()
	check.For(t, 10*time.Second, time.Millisecond, func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		k.mu.Lock()
		defer k.mu.Unlock()
		if len(f.queue) > 0 || k.flushes != f.nexts {
			return fmt.Errorf("frames not applied: %d queued, %d rounds, %d flushes", len(f.queue), f.nexts, k.flushes)
		}
		return nil
	})
}

// A settled answer replays whole from the log, in segments whose part ids
// do not depend on when it is read; other submissions' records are not
// its.
func TestSnapshotReplaysTheRecords(t *testing.T) {
	sub := record.Submission{ID: "s1", Key: key, Offset: "0", TurnID: "t1"}
	l := newMemLog(sub)
	l.append(entry(record.EntryUserMessage, "s1", "", record.MessagePayload{Parts: []record.Part{text("hi")}}))
	l.append(assistant("t1",
		record.Part{Type: record.PartReasoning, Text: "think"},
		text("Hello"),
		record.Part{Type: record.PartToolCall, ToolCallID: "c1", ToolName: "f", Input: json.RawMessage(`{"a":1}`)}))
	l.append(entry(record.EntryToolResult, "s1", "t1", record.ToolResultPayload{ToolCallID: "c1", ToolName: "f", Output: json.RawMessage(`"ok"`)}),
		assistant("t0", text("another turn's")))
	l.append(assistant("t1", text("done")), settled("s0", record.OutcomeFailed, nil), settled("s1", record.OutcomeCompleted, nil))
	l.append(assistant("t1", text("after the settlement")))

	for _, pageLimit := range []int{0, 1} {
		k := &sink{}
		c := config(l)
		c.PageLimit = pageLimit
		v := turnview.New(c, key, sub, nil, false, k)
		if err := v.Snapshot(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !v.Settled() {
			t.Error("not settled")
		}
		k.has(t,
			"start s1",
			"part-start reasoning p0.0", `part-delta reasoning p0.0 "think"`, "part-end reasoning p0.0",
			"part-start text p0.1", `part-delta text p0.1 "Hello"`, "part-end text p0.1",
			`tool-call c1 f {"a":1}`,
			`tool-result c1 f "ok" false`,
			"part-start text p1.0", `part-delta text p1.0 "done"`, "part-end text p1.0",
			"finish completed <nil>")
	}
}

// A snapshot of an answer in progress stops at the log's tail.
func TestSnapshotStopsAtTheTail(t *testing.T) {
	sub := record.Submission{ID: "s1", Key: key, Offset: "0", TurnID: "t1"}
	l := newMemLog(sub)
	l.append(assistant("t1", text("so far")))
	k := &sink{}
	v := turnview.New(config(l), key, sub, newFrames(), false, k)
	if err := v.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v.Settled() {
		t.Error("settled")
	}
	k.has(t, "start s1", "part-start text p0.0", `part-delta text p0.0 "so far"`, "part-end text p0.0")
}

// A view that followed the deltas from the turn's start shows them live,
// and the record completes what they left out: the text comes exactly
// once. Frames of other turns are not its.
func TestLiveDeltasCompletedByTheRecord(t *testing.T) {
	sub := record.Submission{ID: "s1", Key: key, Offset: "0"}
	l := newMemLog(sub)
	f := newFrames()
	k := &sink{}
	done := run(turnview.New(config(l), key, sub, f, true, k))
	k.has(t, "start s1")

	// The turn before, still running while s1 waits: its frames, twice
	// (the second from what the view learnt of the first), are not s1's.
	f.publish(t, delta("t0", turnview.KindText, "earlier"))
	applied(t, f, k)
	f.publish(t, delta("t0", turnview.KindText, "earlier"))
	applied(t, f, k)
	k.has(t, "start s1")

	// The turn starts: the log knows its id before its first frame.
	l.mu.Lock()
	l.sub.TurnID = "t1"
	l.mu.Unlock()
	f.publish(t, delta("t1", turnview.KindReasoning, "hmm"))
	f.publish(t, delta("t1", turnview.KindText, "Hel"))
	f.publish(t, delta("t2", turnview.KindText, "not ours"))
	f.publish(t, delta("t1", turnview.KindText, "lo"))
	live := []string{"start s1",
		"part-start reasoning p0.0", `part-delta reasoning p0.0 "hmm"`, "part-end reasoning p0.0",
		"part-start text p0.1", `part-delta text p0.1 "Hel"`, `part-delta text p0.1 "lo"`}
	k.has(t, live...)

	// A frame lost ("," and " world" never came live): the record has it.
	l.append(assistant("t1", record.Part{Type: record.PartReasoning, Text: "hmm"}, text("Hello, world")), settled("s1", record.OutcomeCompleted, nil))
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	k.has(t, append(live, `part-delta text p0.1 ", world"`, "part-end text p0.1", "finish completed <nil>")...)
}

// A view that joined mid-segment cannot show that segment live: its text
// comes whole with its record. After a tool call it saw live, it follows
// the next segment from its start, holding the deltas until the tool
// call's segment is recorded.
func TestJoinedMidTurn(t *testing.T) {
	sub := record.Submission{ID: "s1", Key: key, Offset: "0", TurnID: "t1"}
	l := newMemLog(sub)
	f := newFrames()
	k := &sink{}
	done := run(turnview.New(config(l), key, sub, f, false, k))
	k.has(t, "start s1")

	f.publish(t, delta("t1", turnview.KindText, "Let me "))
	f.publish(t, wire.DeltaFrame{Type: wire.FrameToolCallDelta, TurnID: "t1", ToolCallID: "c1", ToolName: "f", Args: json.RawMessage(`{}`)})
	f.publish(t, delta("t1", turnview.KindText, "It is"))
	applied(t, f, k)
	k.has(t, "start s1") // nothing live before the tool call's segment is recorded

	l.append(assistant("t1", text("Let me look."), record.Part{Type: record.PartToolCall, ToolCallID: "c1", ToolName: "f", Input: json.RawMessage(`{}`)}))
	seg0 := []string{"start s1",
		"part-start text p0.0", `part-delta text p0.0 "Let me look."`, "part-end text p0.0",
		"tool-call c1 f {}",
		"part-start text p1.0", `part-delta text p1.0 "It is"`}
	k.has(t, seg0...)

	f.publish(t, delta("t1", turnview.KindText, " sunny."))
	k.has(t, append(seg0, `part-delta text p1.0 " sunny."`)...)
	l.append(entry(record.EntryToolResult, "s1", "t1", record.ToolResultPayload{ToolCallID: "c1", ToolName: "f", IsError: true, Output: json.RawMessage(`"boom"`)}))
	k.has(t, append(seg0, `part-delta text p1.0 " sunny."`, `tool-result c1 f "boom" true`)...)

	l.append(assistant("t1", text("It is sunny.")), settled("s1", record.OutcomeFailed, &record.Failure{Code: "x", Message: "m"}))
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	k.has(t, append(seg0, `part-delta text p1.0 " sunny."`, `tool-result c1 f "boom" true`,
		"part-end text p1.0", "finish failed &{x m false}")...)
}

// A reset under the view, a failed write and shutdown end it with an
// error; the client leaving ends it without one.
func TestRunEnds(t *testing.T) {
	sub := record.Submission{ID: "s1", Key: key, Offset: "0", TurnID: "t1"}

	t.Run("reset", func(t *testing.T) {
		l := newMemLog(sub)
		k := &sink{}
		done := run(turnview.New(config(l), key, sub, nil, false, k))
		k.has(t, "start s1")
		l.reset()
		if err := result(t, done); !errors.Is(err, turnview.ErrReset) {
			t.Fatalf("Run = %v, want ErrReset", err)
		}
	})
	t.Run("unknown offset", func(t *testing.T) {
		l := newMemLog(sub)
		s := sub
		s.Offset = "7"
		if err := turnview.New(config(l), key, s, nil, false, &sink{}).Snapshot(context.Background()); !errors.Is(err, turnview.ErrReset) {
			t.Fatalf("Snapshot = %v, want ErrReset", err)
		}
	})
	t.Run("write", func(t *testing.T) {
		l := newMemLog(sub)
		broken := errors.New("broken pipe")
		k := &sink{flushErr: broken}
		if err := result(t, run(turnview.New(config(l), key, sub, nil, false, k))); !errors.Is(err, broken) {
			t.Fatalf("Run = %v, want %v", err, broken)
		}
	})
	t.Run("stopping", func(t *testing.T) {
		l := newMemLog(sub)
		stop := make(chan struct{})
		c := config(l)
		c.Stopping = stop
		k := &sink{}
		done := run(turnview.New(c, key, sub, nil, false, k))
		k.has(t, "start s1")
		close(stop)
		if err := result(t, done); !errors.Is(err, turnview.ErrStopped) {
			t.Fatalf("Run = %v, want ErrStopped", err)
		}
	})
	t.Run("log closed", func(t *testing.T) {
		l := newMemLog(sub)
		k := &sink{}
		done := run(turnview.New(config(l), key, sub, nil, false, k))
		k.has(t, "start s1")
		close(l.done)
		if err := result(t, done); !errors.Is(err, turnview.ErrStopped) {
			t.Fatalf("Run = %v, want ErrStopped", err)
		}
	})
	t.Run("client left", func(t *testing.T) {
		l := newMemLog(sub)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		k := &sink{}
		go func() { done <- turnview.New(config(l), key, sub, nil, false, k).Run(ctx) }()
		k.has(t, "start s1")
		cancel()
		if err := result(t, done); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	})
	t.Run("keepalive", func(t *testing.T) {
		l := newMemLog(sub)
		c := config(l)
		c.Heartbeat = time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		k := &sink{}
		go func() { _ = turnview.New(c, key, sub, nil, false, k).Run(ctx) }()
		check.For(t, 10*time.Second, time.Millisecond, func() error {
			k.mu.Lock()
			defer k.mu.Unlock()
			if k.keepalive < 2 {
				return fmt.Errorf("%d keepalives", k.keepalive)
			}
			return nil
		})
	})
}

// A turn that stops to ask for approvals ends the view with the requests,
// without a settlement; once they are decided (the submission no longer
// waits) the same request is history, and the view goes on to the answer.
func TestInputRequiredEndsTheView(t *testing.T) {
	req := record.ApprovalRequestPayload{Requests: []record.ApprovalRequest{{ApprovalID: "apr_1", ToolCallID: "c1", ToolName: "refund", Input: json.RawMessage(`{}`)}}}
	waiting := record.Submission{ID: "s1", Key: key, Offset: "0", TurnID: "t1", Status: record.StatusInputRequired,
		Approvals: []record.Approval{{ApprovalRequest: req.Requests[0]}}}
	waiting.Pending = record.PendingOf(waiting.Approvals)
	l := newMemLog(waiting)
	l.append(assistant("t1", record.Part{Type: record.PartToolCall, ToolCallID: "c1", ToolName: "refund", Input: json.RawMessage(`{}`)}),
		entry(record.EntryApprovalRequest, "s1", "t1", req))
	k := &sink{}
	v := turnview.New(config(l), key, waiting, nil, false, k)
	if err := v.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !v.Settled() {
		t.Error("the view did not end at the approval request")
	}
	k.has(t, "start s1", "tool-call c1 refund {}", "input-required apr_1/c1")

	// Decided and resumed: the request is history.
	l.mu.Lock()
	l.sub.Status, l.sub.Pending = record.StatusRunning, nil
	l.mu.Unlock()
	l.append(settled("s1", record.OutcomeCompleted, nil))
	k = &sink{}
	v = turnview.New(config(l), key, waiting, nil, false, k)
	if err := v.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	k.has(t, "start s1", "tool-call c1 refund {}", "finish completed <nil>")
}
