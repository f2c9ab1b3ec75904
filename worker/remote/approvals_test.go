package remote_test

import (
	"context"
	"encoding/json"
	"iter"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/pool"
)

// A retried Await (its reply lost) is answered as the success it was, and
// so is a retried Start of the resumed turn: each is stored once.
func TestRetriedAwaitAndResumeStoredOnce(t *testing.T) {
	o := startOwner(t)
	c := o.client(t)
	ctx := context.Background()
	key := record.Key{Agent: "echo", Instance: "i", Session: "await"}
	sub := o.admit(t, key, "x")
	l := holdLease(t, o, c.InstanceID(), key)
	f := pool.Fence{Lease: l.Owner()}
	call := record.EntryRecord(record.Entry{ID: "01JCALLFIXEDID000000000000", Type: record.EntryAssistantMessage,
		Payload: json.RawMessage(`{"parts":[{"type":"tool-call","toolCallId":"c1","toolName":"refund","input":{}}]}`)})
	req := record.ApprovalRequest{ApprovalID: "apr_1", ToolCallID: "c1", ToolName: "refund", Input: json.RawMessage(`{}`)}
	writes := []clog.Write{
		{Key: key, Start: []string{sub.ID}, TurnID: "turn_1"},
		{Key: key, TurnID: "turn_1", Records: []record.Record{call}, Await: &clog.Await{SubmissionID: sub.ID, Requests: []record.ApprovalRequest{req}}},
	}
	step := uint64(0)
	retried := func(ws []clog.Write) {
		t.Helper()
		for i, w := range ws {
			step++
			f.Step = step
			for attempt := range 2 {
				if _, err := c.WriteFenced(ctx, w, f); err != nil {
					t.Fatalf("write %d attempt %d: %v", i, attempt, err)
				}
			}
		}
	}
	retried(writes)
	if s, _ := o.db.Submission(ctx, sub.ID); !s.Waiting() {
		t.Fatalf("after the await: %+v", s)
	}
	if n := len(o.entries(t, key, record.EntryApprovalRequest)); n != 1 {
		t.Fatalf("%d approval requests stored, want 1", n)
	}
	// A different turn's await is no replay.
	if _, err := c.WriteFenced(ctx, clog.Write{Key: key, TurnID: "turn_x", Await: &clog.Await{SubmissionID: sub.ID, Requests: []record.ApprovalRequest{req}}}, f); err == nil {
		t.Fatal("an await of another turn was taken as a replay")
	}
	if _, _, err := o.db.Decide(ctx, clog.Decide{Key: key, SubmissionID: sub.ID, Decisions: []record.ApprovalDecisionPayload{{ApprovalID: "apr_1", Approved: true}}}); err != nil {
		t.Fatal(err)
	}
	retried([]clog.Write{
		{Key: key, Start: []string{sub.ID}, TurnID: "turn_2"},
		{Key: key, TurnID: "turn_2", Settle: []record.Settlement{{SubmissionID: sub.ID, Outcome: record.OutcomeCompleted}}},
	})
	if n := len(o.entries(t, key, record.EntrySettlement)); n != 1 {
		t.Fatalf("%d settlements stored, want 1", n)
	}
}

// The owner aborts a waiting submission itself: no worker holds it.
func TestRemoteAbortWhileWaiting(t *testing.T) {
	o := startOwner(t)
	ctx := context.Background()
	key := record.Key{Agent: "echo", Instance: "i", Session: "abortwait"}
	sub := o.admit(t, key, "x")
	if _, err := o.db.Write(ctx, clog.Write{Key: key, Start: []string{sub.ID}, TurnID: "turn_1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := o.db.Write(ctx, clog.Write{Key: key, TurnID: "turn_1", Await: &clog.Await{SubmissionID: sub.ID,
		Requests: []record.ApprovalRequest{{ApprovalID: "apr_1", ToolCallID: "c1", ToolName: "refund"}}}}); err != nil {
		t.Fatal(err)
	}
	got, err := o.srv.Abort(ctx, sub.ID)
	if err != nil || got.Status != record.StatusAborted || got.Error == nil || got.Error.Code != "aborted" {
		t.Fatalf("abort: %+v %v", got, err)
	}
}

// asker starts a tool call and asks to approve it; resumed, it reports
// each decision as the call's result and completes.
type asker struct{}

func (asker) Invoke(ctx context.Context, _ worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
	return func(yield func(worker.Event) bool) {
		if p.Resume == nil {
			if yield(worker.ToolStarted("c1", "refund", json.RawMessage(`{"n":1}`))) &&
				yield(worker.ApprovalRequested("c1", "refund", json.RawMessage(`{"n":1}`))) {
				yield(worker.Completed(nil))
			}
			return
		}
		for _, d := range p.Resume.Decisions {
			out, _ := json.Marshal(map[string]any{"approved": d.Approved, "input": d.Input, "reason": d.Reason})
			if !yield(worker.ToolEnded(d.ToolCallID, false, out)) {
				return
			}
		}
		yield(worker.Completed(nil))
	}
}

// A remote worker's turn asks; the owner's log holds the wait; decided
// there, a worker resumes the submission with the decisions, which
// travel to it with the submission.
func TestRemoteWorkerAsksAndResumes(t *testing.T) {
	o := startOwner(t)
	startWorker(t, o)
	ctx := context.Background()
	key := record.Key{Agent: "ask", Instance: "i", Session: "ask"}
	sub := o.admit(t, key, "refund me")
	var w record.Submission
	waitFor(t, "the submission to wait", func() bool {
		var err error
		w, err = o.db.Submission(ctx, sub.ID)
		return err == nil && w.Waiting()
	})
	if _, _, err := o.db.Decide(ctx, clog.Decide{Key: key, SubmissionID: sub.ID, Decisions: []record.ApprovalDecisionPayload{
		{ApprovalID: w.Pending[0].ApprovalID, Approved: true, Reason: "fine", Input: json.RawMessage(`{"n":2}`)},
	}}); err != nil {
		t.Fatal(err)
	}
	o.relay.Kick()
	if s := o.settled(t, sub.ID); s.Status != record.StatusCompleted {
		t.Fatalf("settled %+v", s)
	}
	results := o.entries(t, key, record.EntryToolResult)
	if len(results) != 1 {
		t.Fatalf("%d tool results", len(results))
	}
	var p record.ToolResultPayload
	json.Unmarshal(results[0].Payload, &p)
	if p.ToolCallID != "c1" || p.ToolName != "refund" || string(p.Output) != `{"approved":true,"input":{"n":2},"reason":"fine"}` {
		t.Fatalf("tool result %+v %s", p, p.Output)
	}
}

// With remote workers the approval timers are the log owner's: the
// worker's Await arms one, and when it expires the submission resumes
// with the denials.
func TestRemoteApprovalTimeout(t *testing.T) {
	o := startOwner(t)
	startWorker(t, o)
	key := record.Key{Agent: "asktimeout", Instance: "i", Session: "t"}
	sub := o.admit(t, key, "refund me")
	if s := o.settled(t, sub.ID); s.Status != record.StatusCompleted {
		t.Fatalf("settled %+v", s)
	}
	decisions := o.entries(t, key, record.EntryApprovalDecision)
	results := o.entries(t, key, record.EntryToolResult)
	if len(decisions) != 1 || len(results) != 1 {
		t.Fatalf("%d decisions, %d results", len(decisions), len(results))
	}
	var p record.ToolResultPayload
	json.Unmarshal(results[0].Payload, &p)
	if string(p.Output) != `{"approved":false,"input":null,"reason":"timeout"}` {
		t.Fatalf("tool result %s", p.Output)
	}
}
