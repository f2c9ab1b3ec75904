package pool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/pool"
)

func TestEchoTurn(t *testing.T) {
	r := startRig(t, nil)
	key := record.Key{Agent: "echo", Instance: "i1", Session: "s1"}
	sub := r.admit(t, key, "hello there  world")
	got := r.settled(t, sub.ID)
	if got.Status != record.StatusCompleted || got.TurnID == "" {
		t.Fatalf("settled %+v", got)
	}
	recs := r.records(t, key)
	if len(recs) != 3 {
		t.Fatalf("records %d: %+v", len(recs), recs)
	}
	types := []string{recs[0].Entry.Type, recs[1].Entry.Type, recs[2].Entry.Type}
	if strings.Join(types, ",") != "user_message,assistant_message,settlement" {
		t.Fatalf("types %v", types)
	}
	var msg record.MessagePayload
	json.Unmarshal(recs[1].Entry.Payload, &msg)
	if len(msg.Parts) != 1 || msg.Parts[0].Text != "hello there  world" {
		t.Fatalf("assistant %+v", msg)
	}
	if recs[1].Entry.ParentID != recs[0].Entry.ID || recs[1].Entry.SubmissionID != sub.ID {
		t.Fatalf("assistant entry %+v", recs[1].Entry)
	}
}

// blocker is an agent whose turns wait for a release, to make sessions busy
// on purpose.
type blocker struct {
	started chan string
	release chan struct{}
}

func (b *blocker) Invoke(ctx context.Context, _ worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
	return func(yield func(worker.Event) bool) {
		b.started <- p.Text
		select {
		case <-b.release:
		case <-ctx.Done():
			return
		}
		if yield(worker.Text("re: " + p.Text)) {
			yield(worker.Completed(nil))
		}
	}
}

func TestBusySessionAnsweredTogether(t *testing.T) {
	b := &blocker{started: make(chan string, 10), release: make(chan struct{})}
	r := startRig(t, func(reg *pool.Registry) { reg.Register("slow", b, "") })
	key := record.Key{Agent: "slow", Instance: "i", Session: "s"}
	first := r.admit(t, key, "one")
	if p := <-b.started; p != "one" {
		t.Fatalf("first prompt %q", p)
	}
	second := r.admit(t, key, "two")
	third := r.admit(t, key, "three")
	b.release <- struct{}{}
	if s := r.settled(t, first.ID); s.Status != record.StatusCompleted || s.AnsweredBySubmissionID != "" {
		t.Fatalf("first %+v", s)
	}
	// The next turn answers both queued submissions at once.
	if p := <-b.started; p != "two\n\nthree" {
		t.Fatalf("second prompt %q", p)
	}
	b.release <- struct{}{}
	s2, s3 := r.settled(t, second.ID), r.settled(t, third.ID)
	if s2.Status != record.StatusCompleted || s3.AnsweredBySubmissionID != second.ID || s2.TurnID != s3.TurnID {
		t.Fatalf("second %+v third %+v", s2, s3)
	}
}

func TestTurnsInOrderNeverConcurrent(t *testing.T) {
	var mu sync.Mutex
	active := map[string]int{}
	var overlap error
	var order = map[string][]string{}
	agent := worker.AgentFunc(func(ctx context.Context, sc worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
		return func(yield func(worker.Event) bool) {
			mu.Lock()
			active[sc.Session]++
			if active[sc.Session] > 1 {
				overlap = fmt.Errorf("two turns at once on %s", sc.Session)
			}
			order[sc.Session] = append(order[sc.Session], strings.Split(p.Text, "\n\n")...)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			active[sc.Session]--
			mu.Unlock()
			yield(worker.Completed(nil))
		}
	})
	r := startRig(t, func(reg *pool.Registry) { reg.Register("count", agent, "") })
	const sessions, perSession = 8, 25
	var subs []record.Submission
	for i := range perSession {
		for s := range sessions {
			key := record.Key{Agent: "count", Instance: "i", Session: fmt.Sprint("s", s)}
			subs = append(subs, r.admit(t, key, fmt.Sprint(i)))
		}
	}
	for _, s := range subs {
		if got := r.settled(t, s.ID); got.Status != record.StatusCompleted {
			t.Fatalf("%+v", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if overlap != nil {
		t.Fatal(overlap)
	}
	for s, seq := range order {
		if len(seq) != perSession {
			t.Fatalf("%s saw %d prompts: %v", s, len(seq), seq)
		}
		for i, v := range seq {
			if v != fmt.Sprint(i) {
				t.Fatalf("%s out of order: %v", s, seq)
			}
		}
	}
}

func TestAgentFailures(t *testing.T) {
	cases := []struct {
		name  string
		agent worker.AgentFunc
		want  record.Failure
	}{
		{"failed event", func(ctx context.Context, _ worker.Scope, _ worker.Prompt) iter.Seq[worker.Event] {
			return func(yield func(worker.Event) bool) {
				yield(worker.Text("partial"))
				yield(worker.Failed("model overloaded", true, "overloaded"))
			}
		}, record.Failure{Code: "overloaded", Message: "model overloaded", Retryable: true}},
		{"no terminal", func(ctx context.Context, _ worker.Scope, _ worker.Prompt) iter.Seq[worker.Event] {
			return func(yield func(worker.Event) bool) { yield(worker.Text("x")) }
		}, record.Failure{Code: "agent_protocol", Retryable: true}},
		{"panic", func(ctx context.Context, _ worker.Scope, _ worker.Prompt) iter.Seq[worker.Event] {
			return func(yield func(worker.Event) bool) { panic("boom") }
		}, record.Failure{Code: "agent_panic"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := startRig(t, func(reg *pool.Registry) { reg.Register("bad", tc.agent, "") })
			key := record.Key{Agent: "bad", Instance: "i", Session: "s"}
			sub := r.admit(t, key, "x")
			got := r.settled(t, sub.ID)
			if got.Status != record.StatusFailed || got.Error == nil || got.Error.Code != tc.want.Code || got.Error.Retryable != tc.want.Retryable ||
				(tc.want.Message != "" && got.Error.Message != tc.want.Message) {
				t.Fatalf("settled %+v %+v", got, got.Error)
			}
			// The session goes on.
			next := r.admit(t, key, "y")
			if got := r.settled(t, next.ID); !got.Status.Terminal() {
				t.Fatalf("next %+v", got)
			}
		})
	}
}

func TestToolCallsRecordedAsTheyComplete(t *testing.T) {
	agent := worker.AgentFunc(func(ctx context.Context, _ worker.Scope, _ worker.Prompt) iter.Seq[worker.Event] {
		return func(yield func(worker.Event) bool) {
			_ = yield(worker.Thinking("hmm")) &&
				yield(worker.Text("Looking.")) &&
				yield(worker.ToolStarted("c1", "search", json.RawMessage(`{"q":"x"}`))) &&
				yield(worker.ToolEnded("c1", false, json.RawMessage(`["r1"]`))) &&
				yield(worker.Event{Type: "future_event"}) &&
				yield(worker.Text("Found r1.")) &&
				yield(worker.Completed(json.RawMessage(`{"n":1}`)))
		}
	})
	r := startRig(t, func(reg *pool.Registry) { reg.Register("tools", agent, "") })
	key := record.Key{Agent: "tools", Instance: "i", Session: "s"}
	sub := r.admit(t, key, "find x")
	r.settled(t, sub.ID)
	recs := r.records(t, key)
	var types []string
	for _, rec := range recs {
		types = append(types, rec.Entry.Type)
	}
	if strings.Join(types, ",") != "user_message,assistant_message,tool_result,assistant_message,settlement" {
		t.Fatalf("types %v", types)
	}
	var first, last record.MessagePayload
	json.Unmarshal(recs[1].Entry.Payload, &first)
	json.Unmarshal(recs[3].Entry.Payload, &last)
	if len(first.Parts) != 3 || first.Parts[0].Type != record.PartReasoning || first.Parts[2].Type != record.PartToolCall {
		t.Fatalf("first message %+v", first)
	}
	var result record.ToolResultPayload
	json.Unmarshal(recs[2].Entry.Payload, &result)
	if result.ToolCallID != "c1" || result.ToolName != "search" || string(result.Output) != `["r1"]` {
		t.Fatalf("tool result %+v", result)
	}
	if len(last.Parts) != 2 || last.Parts[0].Text != "Found r1." || last.Parts[1].Type != record.PartData {
		t.Fatalf("last message %+v", last)
	}
}

func TestDeltasReachFollowers(t *testing.T) {
	r := startRig(t, nil)
	key := record.Key{Agent: "echo", Instance: "i.with.dots", Session: "s"}
	cur, err := r.bus.FollowDeltas(key)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	other, _ := r.bus.FollowDeltas(record.Key{Agent: "echo", Instance: "i", Session: "elsewhere"})
	defer other.Close()
	sub := r.admit(t, key, "a b c")
	r.settled(t, sub.ID)
	var text strings.Builder
	for text.String() != "a b c" {
		select {
		case <-cur.Ready():
			for _, f := range cur.Next(nil) {
				var fr wire.DeltaFrame
				if err := json.Unmarshal(f, &fr); err != nil || fr.Type != wire.FrameDelta || fr.SubmissionID != sub.ID {
					t.Fatalf("frame %s %v", f, err)
				}
				text.WriteString(fr.Delta)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("deltas so far %q", text.String())
		}
	}
	if got := other.Next(nil); len(got) != 0 {
		t.Fatalf("another conversation's follower got %q", got)
	}
}

func TestAbort(t *testing.T) {
	b := &blocker{started: make(chan string, 10), release: make(chan struct{})}
	r := startRig(t, func(reg *pool.Registry) { reg.Register("slow", b, "") })
	key := record.Key{Agent: "slow", Instance: "i", Session: "s"}
	running := r.admit(t, key, "one")
	<-b.started
	queued := r.admit(t, key, "two")

	// Not started: settled aborted without running.
	got, err := r.pool.Abort(context.Background(), queued.ID)
	if err != nil || got.Status != record.StatusAborted {
		t.Fatalf("abort queued: %+v %v", got, err)
	}
	// Running: the turn is cancelled and settles aborted.
	got, err = r.pool.Abort(context.Background(), running.ID)
	if err != nil || got.Status != record.StatusAborted {
		t.Fatalf("abort running: %+v %v", got, err)
	}
	if _, err := r.pool.Abort(context.Background(), running.ID); !errors.Is(err, clog.ErrSubmissionSettled) {
		t.Fatalf("abort settled: %v", err)
	}
	// The aborted queued submission never ran; the session still works.
	next := r.admit(t, key, "three")
	if p := <-b.started; p != "three" {
		t.Fatalf("prompt after abort %q", p)
	}
	b.release <- struct{}{}
	if s := r.settled(t, next.ID); s.Status != record.StatusCompleted {
		t.Fatalf("%+v", s)
	}
}

// A stream reset under a running turn: the reset settles its submission
// (aborted, stream_reset) and the turn writes nothing into the new
// incarnation.
func TestResetUnderRunningTurn(t *testing.T) {
	b := &blocker{started: make(chan string, 10), release: make(chan struct{})}
	r := startRig(t, func(reg *pool.Registry) { reg.Register("slow", b, "") })
	key := record.Key{Agent: "slow", Instance: "i", Session: "s"}
	sub := r.admit(t, key, "one")
	<-b.started
	inc, err := r.db.Reset(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	b.release <- struct{}{}
	// The next submission runs normally, after the stopped turn.
	next := r.admit(t, key, "two")
	<-b.started
	b.release <- struct{}{}
	if s := r.settled(t, next.ID); s.Status != record.StatusCompleted {
		t.Fatalf("next %+v", s)
	}
	if s, _ := r.db.Submission(context.Background(), sub.ID); s.Status != record.StatusAborted || s.Error.Code != "stream_reset" {
		t.Fatalf("reset submission %+v", s)
	}
	for _, rec := range r.records(t, key) {
		if rec.Entry.SubmissionID == sub.ID && rec.Entry.Type != record.EntrySettlement {
			t.Fatalf("the stopped turn wrote into incarnation %s: %+v", inc, rec.Entry)
		}
	}
}

// The agent sees who delivered its turn's submission: the principal the
// HTTP layer recorded in the user message's metadata.
func TestScopeCarriesThePrincipal(t *testing.T) {
	scopes := make(chan worker.Scope, 2)
	r := startRig(t, func(reg *pool.Registry) {
		reg.Register("who", worker.AgentFunc(func(_ context.Context, sc worker.Scope, _ worker.Prompt) iter.Seq[worker.Event] {
			scopes <- sc
			return func(yield func(worker.Event) bool) { yield(worker.Completed(nil)) }
		}), "")
	})
	key := record.Key{Agent: "who", Instance: "i", Session: "s"}
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: "hi"}},
		Metadata: json.RawMessage(`{"principal":{"issuer":"https://idp/","subject":"alice"}}`)})
	sub, _, err := r.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})}})
	if err != nil {
		t.Fatal(err)
	}
	r.relay.Kick()
	r.settled(t, sub.ID)
	sc := <-scopes
	if sc.Principal == nil || sc.Principal.Subject != "alice" || sc.Principal.Issuer != "https://idp/" {
		t.Fatalf("scope %+v", sc)
	}
	// Without access control there is no principal.
	r.settled(t, r.admit(t, key, "anonymous").ID)
	if sc := <-scopes; sc.Principal != nil {
		t.Errorf("an anonymous delivery's scope has a principal: %+v", sc.Principal)
	}
}
