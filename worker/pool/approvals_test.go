package pool_test

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/pool"
)

// asker is an agent that, for a prompt starting with "ask", starts a tool
// call and asks to approve it; resumed, it ends each decided call and
// says so. Any other prompt is echoed.
type asker struct {
	mu      sync.Mutex
	resumes []*worker.Resume
	invokes int
	// bogus makes it ask to approve a call it never started.
	bogus bool
}

func (a *asker) Invoke(ctx context.Context, _ worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
	a.mu.Lock()
	a.invokes++
	if p.Resume != nil {
		a.resumes = append(a.resumes, p.Resume)
	}
	a.mu.Unlock()
	return func(yield func(worker.Event) bool) {
		switch {
		case p.Resume != nil:
			for _, d := range p.Resume.Decisions {
				out := json.RawMessage(`{"denied":true}`)
				if d.Approved {
					out = json.RawMessage(`{"refunded":true}`)
				}
				if !yield(worker.ToolEnded(d.ToolCallID, !d.Approved, out)) {
					return
				}
			}
			if yield(worker.Text("done")) {
				yield(worker.Completed(nil))
			}
		case strings.HasPrefix(p.Text, "ask"):
			args := json.RawMessage(`{"amount":5}`)
			id := "call_" + p.Text
			if !yield(worker.ToolStarted(id, "refund", args)) {
				return
			}
			if a.bogus {
				id = "call_unknown"
			}
			if yield(worker.ApprovalRequested(id, "refund", args)) {
				yield(worker.Completed(nil))
			}
		default:
			if yield(worker.Text(p.Text)) {
				yield(worker.Completed(nil))
			}
		}
	}
}

func (a *asker) seen() (invokes int, resumes []*worker.Resume) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.invokes, append([]*worker.Resume(nil), a.resumes...)
}

func startAsker(t *testing.T, a *asker, busy worker.BusyPolicy) *rig {
	t.Helper()
	return startRig(t, func(reg *pool.Registry) {
		if err := reg.RegisterWith("asker", a, worker.AgentOptions{Busy: busy, Approvals: true}); err != nil {
			t.Fatal(err)
		}
	})
}

// waiting waits until the submission is input_required with requests.
func (r *rig) waiting(t *testing.T, id string) record.Submission {
	t.Helper()
	var got record.Submission
	check.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		s, err := r.db.Submission(context.Background(), id)
		if err != nil {
			return err
		}
		if s.Status.Terminal() {
			t.Fatalf("settled instead of waiting: %+v", s)
		}
		if !s.Waiting() {
			return fmt.Errorf("submission %s is %s", id, s.Status)
		}
		got = s
		return nil
	})
	return got
}

func entryTypes(recs []record.Record) []string {
	var out []string
	for _, rec := range recs {
		if rec.Entry != nil {
			out = append(out, rec.Entry.Type)
		}
	}
	return out
}

func TestApprovalAskDecideResume(t *testing.T) {
	a := &asker{}
	r := startAsker(t, a, worker.BusyQueue)
	ctx := context.Background()
	key := record.Key{Agent: "asker", Instance: "i1", Session: "s1"}
	sub := r.admit(t, key, "ask1")
	w := r.waiting(t, sub.ID)
	if len(w.Pending) != 1 || w.Pending[0].ToolCallID != "call_ask1" || w.Pending[0].ToolName != "refund" ||
		!strings.HasPrefix(w.Pending[0].ApprovalID, "apr_") || string(w.Pending[0].Input) != `{"amount":5}` {
		t.Fatalf("pending %+v", w.Pending)
	}
	if got := strings.Join(entryTypes(r.records(t, key)), ","); got != "user_message,assistant_message,approval_request" {
		t.Fatalf("while waiting: %s", got)
	}

	// A later delivery under queue stays admitted while the first waits.
	second := r.admit(t, key, "later")
	time.Sleep(200 * time.Millisecond) // give a wrong dispatch the chance to run it
	if s, _ := r.db.Submission(ctx, second.ID); s.Status != record.StatusAdmitted {
		t.Fatalf("second while the first waits: %+v", s)
	}

	res, _, err := r.db.Decide(ctx, clog.Decide{Key: key, SubmissionID: sub.ID, Decisions: []record.ApprovalDecisionPayload{
		{ApprovalID: w.Pending[0].ApprovalID, Approved: true, Reason: "ok"},
	}})
	if err != nil || !res.Resumed {
		t.Fatalf("decide: %+v %v", res, err)
	}
	r.relay.Kick()
	got := r.settled(t, sub.ID)
	if got.Status != record.StatusCompleted {
		t.Fatalf("resumed: %+v", got)
	}
	if s := r.settled(t, second.ID); s.Status != record.StatusCompleted {
		t.Fatalf("second: %+v", s)
	}
	_, resumes := a.seen()
	if len(resumes) != 1 || len(resumes[0].Decisions) != 1 {
		t.Fatalf("resumes %+v", resumes)
	}
	d := resumes[0].Decisions[0]
	if d.ApprovalID != w.Pending[0].ApprovalID || d.ToolCallID != "call_ask1" || d.ToolName != "refund" ||
		!d.Approved || d.Reason != "ok" || string(d.Args) != `{"amount":5}` {
		t.Fatalf("decision %+v", d)
	}
	recs := r.records(t, key)
	// The second delivery's message was admitted while the first waited;
	// its turn comes after the first settles.
	want := "user_message,assistant_message,approval_request,user_message," +
		"approval_decision,tool_result,assistant_message,settlement,assistant_message,settlement"
	if got := strings.Join(entryTypes(recs), ","); got != want {
		t.Fatalf("stream\n got %s\nwant %s", got, want)
	}
	settlements := 0
	for _, rec := range recs {
		if rec.Entry.Type == record.EntrySettlement && rec.Entry.SubmissionID == sub.ID {
			settlements++
		}
		if rec.Entry.Type == record.EntryToolResult {
			var p record.ToolResultPayload
			json.Unmarshal(rec.Entry.Payload, &p)
			if p.ToolCallID != "call_ask1" || p.ToolName != "refund" || p.IsError {
				t.Fatalf("tool result %+v", p)
			}
		}
	}
	if settlements != 1 {
		t.Fatalf("%d settlements of the resumed submission", settlements)
	}
}

func TestApprovalAbortWhileWaiting(t *testing.T) {
	a := &asker{}
	r := startAsker(t, a, worker.BusyQueue)
	ctx := context.Background()
	key := record.Key{Agent: "asker", Instance: "i1", Session: "s1"}
	sub := r.admit(t, key, "ask1")
	r.waiting(t, sub.ID)
	got, err := r.pool.Abort(ctx, sub.ID)
	if err != nil || got.Status != record.StatusAborted || got.Error == nil || got.Error.Code != "aborted" {
		t.Fatalf("abort: %+v %v", got, err)
	}
	// The session runs again.
	next := r.admit(t, key, "hello")
	if s := r.settled(t, next.ID); s.Status != record.StatusCompleted {
		t.Fatalf("next: %+v", s)
	}
}

func TestApprovalRewindWhileWaiting(t *testing.T) {
	a := &asker{}
	r := startAsker(t, a, worker.BusyQueue)
	ctx := context.Background()
	key := record.Key{Agent: "asker", Instance: "i1", Session: "s1"}
	sub := r.admit(t, key, "ask1")
	r.waiting(t, sub.ID)
	if _, _, err := r.db.Change(ctx, clog.Change{Kind: clog.ChangeRewind, Key: key, EntryID: sub.EntryID}); err != nil {
		t.Fatal(err)
	}
	if s := r.settled(t, sub.ID); s.Status != record.StatusAborted {
		t.Fatalf("after the rewind: %+v", s)
	}
	if inv, resumes := a.seen(); inv != 1 || len(resumes) != 0 {
		t.Fatalf("invokes %d resumes %d", inv, len(resumes))
	}
}

func TestApprovalOfAnUnknownCallIsAProtocolError(t *testing.T) {
	a := &asker{bogus: true}
	r := startAsker(t, a, worker.BusyQueue)
	key := record.Key{Agent: "asker", Instance: "i1", Session: "s1"}
	sub := r.admit(t, key, "ask1")
	if s := r.settled(t, sub.ID); s.Status != record.StatusFailed || s.Error == nil || s.Error.Code != "agent_protocol" {
		t.Fatalf("settled %+v", s)
	}
}

// TestApprovalResumeAfterTheRunnerLeft: decided after the session's
// runner stopped lingering, the resumption is delivered by the relay, not
// dropped by the stream as a duplicate of the admission (only a sweep
// would find it then, 10s later).
func TestApprovalResumeAfterTheRunnerLeft(t *testing.T) {
	a := &asker{}
	r := startAsker(t, a, worker.BusyQueue)
	ctx := context.Background()
	key := record.Key{Agent: "asker", Instance: "i1", Session: "s1"}
	sub := r.admit(t, key, "ask1")
	w := r.waiting(t, sub.ID)
	// The runner lingers with the session's lease, then leaves: only a
	// doorbell starts the resumed turn.
	time.Sleep(pool.DefaultLinger + 300*time.Millisecond)
	if _, _, err := r.db.Decide(ctx, clog.Decide{Key: key, SubmissionID: sub.ID, Decisions: []record.ApprovalDecisionPayload{
		{ApprovalID: w.Pending[0].ApprovalID, Approved: false, Reason: "no"},
	}}); err != nil {
		t.Fatal(err)
	}
	r.relay.Kick()
	check.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		s, err := r.db.Submission(ctx, sub.ID)
		if err == nil && s.Status != record.StatusCompleted {
			err = fmt.Errorf("submission is %s", s.Status)
		}
		return err
	})
	if _, resumes := a.seen(); len(resumes) != 1 || resumes[0].Decisions[0].Approved || resumes[0].Decisions[0].Reason != "no" {
		t.Fatalf("resumes %+v", resumes)
	}
}

// gated holds a turn whose prompt is "hold" until released; the others
// go to the asker.
type gated struct {
	*asker
	started chan struct{}
	release chan struct{}
}

func (g *gated) Invoke(ctx context.Context, s worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
	if p.Text != "hold" {
		return g.asker.Invoke(ctx, s, p)
	}
	return func(yield func(worker.Event) bool) {
		g.started <- struct{}{}
		select {
		case <-g.release:
		case <-ctx.Done():
			return
		}
		if yield(worker.Text("held")) {
			yield(worker.Completed(nil))
		}
	}
}

// An agent configured without approvals that asks anyway in a turn
// answering several submissions (join) fails that turn: one submission
// waits, not several.
func TestApprovalInAJoinedTurnFails(t *testing.T) {
	g := &gated{asker: &asker{}, started: make(chan struct{}, 1), release: make(chan struct{})}
	r := startRig(t, func(reg *pool.Registry) { reg.Register("g", g, worker.BusyJoin) })
	key := record.Key{Agent: "g", Instance: "i", Session: "s"}
	first := r.admit(t, key, "hold")
	<-g.started
	second, third := r.admit(t, key, "ask2"), r.admit(t, key, "ask3")
	close(g.release)
	r.settled(t, first.ID)
	for _, id := range []string{second.ID, third.ID} {
		if s := r.settled(t, id); s.Status != record.StatusFailed || s.Error == nil || s.Error.Code != "approval_joined" {
			t.Fatalf("%s: %+v %+v", id, s, s.Error)
		}
	}
}

// With approvals configured, a join agent answers one submission per
// turn: the one that asks waits alone, the next waits behind it.
func TestApprovalAgentAnswersOneAtATime(t *testing.T) {
	g := &gated{asker: &asker{}, started: make(chan struct{}, 1), release: make(chan struct{})}
	r := startRig(t, func(reg *pool.Registry) {
		reg.RegisterWith("g", g, worker.AgentOptions{Busy: worker.BusyJoin, Approvals: true})
	})
	ctx := context.Background()
	key := record.Key{Agent: "g", Instance: "i", Session: "s"}
	first := r.admit(t, key, "hold")
	<-g.started
	second, third := r.admit(t, key, "ask2"), r.admit(t, key, "hello")
	close(g.release)
	r.settled(t, first.ID)
	w := r.waiting(t, second.ID)
	if s, _ := r.db.Submission(ctx, third.ID); s.Status != record.StatusAdmitted {
		t.Fatalf("third while the second waits: %+v", s)
	}
	if _, _, err := r.db.Decide(ctx, clog.Decide{Key: key, SubmissionID: second.ID, Decisions: []record.ApprovalDecisionPayload{
		{ApprovalID: w.Pending[0].ApprovalID, Approved: true},
	}}); err != nil {
		t.Fatal(err)
	}
	r.relay.Kick()
	s2, s3 := r.settled(t, second.ID), r.settled(t, third.ID)
	if s2.Status != record.StatusCompleted || s3.Status != record.StatusCompleted || s2.TurnID == s3.TurnID || s3.AnsweredBySubmissionID != "" {
		t.Fatalf("second %+v third %+v", s2, s3)
	}
}

// A wait outlives the process: recovery never calls a waiting submission
// interrupted, and a decision after the restart resumes it.
func TestApprovalWaitSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	a := &asker{}
	register := func(reg *pool.Registry) {
		reg.RegisterWith("asker", a, worker.AgentOptions{Busy: worker.BusyQueue, Approvals: true})
	}
	// Deaf to the relay: only recovery and sweeps find its work.
	deaf := rigOptions{sweep: 50 * time.Millisecond, poolNamespace: "deaf"}
	r := startRigWith(t, dir, register, deaf)
	ctx := context.Background()
	key := record.Key{Agent: "asker", Instance: "i1", Session: "s1"}
	sub := r.admit(t, key, "ask1")
	w := r.waiting(t, sub.ID)
	r.stop()

	r = startRigWith(t, dir, register, deaf)
	check.For(t, 10*time.Second, 10*time.Millisecond, r.pool.Ready)
	if s, err := r.db.Submission(ctx, sub.ID); err != nil || !s.Waiting() {
		t.Fatalf("after recovery: %+v %v", s, err)
	}
	// The pool hears no doorbell: a sweep finds it resumable.
	if _, _, err := r.db.Decide(ctx, clog.Decide{Key: key, SubmissionID: sub.ID, Decisions: []record.ApprovalDecisionPayload{
		{ApprovalID: w.Pending[0].ApprovalID, Approved: true},
	}}); err != nil {
		t.Fatal(err)
	}
	if s := r.settled(t, sub.ID); s.Status != record.StatusCompleted {
		t.Fatalf("resumed: %+v", s)
	}
	if inv, resumes := a.seen(); inv != 2 || len(resumes) != 1 {
		t.Fatalf("invokes %d resumes %d", inv, len(resumes))
	}
}

// approvalTimeout denies what is undecided when it expires, and the
// submission resumes with the denials; the deadline outlives a restart
// (recovery arms it again).
func TestApprovalTimeout(t *testing.T) {
	dir := t.TempDir()
	a := &asker{}
	register := func(reg *pool.Registry) {
		reg.RegisterWith("asker", a, worker.AgentOptions{Busy: worker.BusyQueue, Approvals: true, ApprovalTimeout: time.Second})
	}
	r := startRigIn(t, dir, register)
	key := record.Key{Agent: "asker", Instance: "i1", Session: "s1"}
	sub := r.admit(t, key, "ask1")
	w := r.waiting(t, sub.ID)
	if w.ApprovalDeadline.IsZero() {
		t.Fatalf("no deadline: %+v", w)
	}
	r.stop() // before the deadline: the next start's recovery arms it

	r = startRigIn(t, dir, register)
	if s := r.settled(t, sub.ID); s.Status != record.StatusCompleted {
		t.Fatalf("settled %+v", s)
	}
	_, resumes := a.seen()
	if len(resumes) != 1 || len(resumes[0].Decisions) != 1 {
		t.Fatalf("resumes %+v", resumes)
	}
	if d := resumes[0].Decisions[0]; d.Approved || d.Reason != worker.ReasonTimeout {
		t.Fatalf("decision %+v", d)
	}
	var decisions []record.ApprovalDecisionPayload
	for _, rec := range r.records(t, key) {
		if rec.Entry.Type == record.EntryApprovalDecision {
			var p record.ApprovalDecisionPayload
			json.Unmarshal(rec.Entry.Payload, &p)
			decisions = append(decisions, p)
		}
	}
	if len(decisions) != 1 || decisions[0].Approved || decisions[0].Reason != record.ReasonTimeout ||
		decisions[0].Principal == nil || decisions[0].Principal.Subject != "convlog:timeout" {
		t.Fatalf("decisions %+v", decisions)
	}

}
