package agentwire

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/convlog/convlog/worker"
)

// The wire's approval_requested event is the worker event, reason and all.
func TestApprovalRequestedEvent(t *testing.T) {
	in := `{"type":"approval_requested","id":"c1","name":"refund","args":{"amount":5},"reason":"over 100"}` + "\n" + `{"type":"completed"}` + "\n"
	var evs []worker.Event
	terminal, err := Read(strings.NewReader(in), NDJSON, func(ev worker.Event) bool { evs = append(evs, ev); return true })
	if err != nil || !terminal || len(evs) != 2 {
		t.Fatalf("%v %v %+v", terminal, err, evs)
	}
	ev := evs[0]
	if ev.Type != worker.EventApprovalRequested || ev.ID != "c1" || ev.Name != "refund" || string(ev.Args) != `{"amount":5}` || ev.Reason != "over 100" {
		t.Fatalf("%+v", ev)
	}
	want := worker.ApprovalRequested("c1", "refund", json.RawMessage(`{"amount":5}`))
	want.Reason = "over 100"
	ev.Raw = nil
	if b1, b2 := mustJSON(t, ev), mustJSON(t, want); b1 != b2 {
		t.Fatalf("%s != %s", b1, b2)
	}
}

// A resumed turn's request carries the decisions as "resume", beside
// the prompt, in the form of the issue; a first turn's has none.
func TestRequestResume(t *testing.T) {
	p := worker.Prompt{Text: "refund me", Resume: &worker.Resume{Decisions: []worker.Decision{
		{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{"amount":5}`), Approved: true, Input: json.RawMessage(`{"amount":3}`)},
		{ApprovalID: "ap2", ToolCallID: "c2", ToolName: "deploy", Args: json.RawMessage(`{}`), Reason: "timeout"},
	}}}
	got := mustJSON(t, NewRequest(worker.Scope{Session: "a/i/s", Agent: "a", Instance: "i"}, p))
	want := `{"scope":{"session":"a/i/s","agent":"a","instance":"i"},"prompt":{"text":"refund me"},"resume":{"decisions":[` +
		`{"approvalId":"ap1","toolCallId":"c1","toolName":"refund","args":{"amount":5},"approved":true,"input":{"amount":3}},` +
		`{"approvalId":"ap2","toolCallId":"c2","toolName":"deploy","args":{},"approved":false,"reason":"timeout"}]}}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if got := mustJSON(t, NewRequest(worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "x"})); strings.Contains(got, "resume") {
		t.Fatalf("%s", got)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
