package transport_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// waitingSubmission delivers to streamKey and makes its turn ask for two
// approvals, as a runner does: the submission then waits, input_required.
func waitingSubmission(t *testing.T, e *env) (wire.Accepted, []record.ApprovalRequest) {
	t.Helper()
	ctx := testCtx(t)
	acc, err := e.c.Deliver(ctx, "echo", "i1", wire.DeliverRequest{Message: wire.Message{Body: "refund order 7"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Write(ctx, log.Write{Key: streamKey, Start: []string{acc.SubmissionID}, TurnID: "turn_ask"}); err != nil {
		t.Fatal(err)
	}
	reqs := []record.ApprovalRequest{
		{ApprovalID: "apr_1", ToolCallID: "call_1", ToolName: "refund", Input: json.RawMessage(`{"order":7}`)},
		{ApprovalID: "apr_2", ToolCallID: "call_2", ToolName: "email", Input: json.RawMessage(`{"to":"a@b"}`)},
	}
	if _, err := e.db.Write(ctx, log.Write{Key: streamKey, TurnID: "turn_ask", Await: &log.Await{SubmissionID: acc.SubmissionID, Requests: reqs}}); err != nil {
		t.Fatal(err)
	}
	return acc, reqs
}

// readFrom is every record of streamKey from offset on.
func readFrom(t *testing.T, e *env, offset record.Offset) []record.Record {
	t.Helper()
	res, err := e.db.Read(context.Background(), streamKey, offset, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []record.Record
	for _, b := range res.Batches {
		recs, err := b.Records.Decode()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, recs...)
	}
	return out
}

func TestApprovalsDecide(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	acc, reqs := waitingSubmission(t, e)
	path := "/agents/echo/i1/submissions/" + acc.SubmissionID + "/approvals"

	// A long poll returns as soon as the submission waits for a person.
	s, err := e.c.Submission(ctx, "echo", "i1", acc.SubmissionID, 30*time.Second)
	if err != nil || s.Status != record.StatusInputRequired || len(s.Pending) != 2 || s.Pending[0].ApprovalID != "apr_1" {
		t.Fatalf("waiting: %+v %v", s, err)
	}

	code, _, body := e.postJSON(t, path, `{"decisions":[{"approvalId":"apr_1","approved":true,"input":{"order":7,"amount":5}}]}`, nil)
	if code != http.StatusAccepted {
		t.Fatalf("decide one: %d %s", code, body)
	}
	var d wire.Decided
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	if d.Status != record.StatusInputRequired || len(d.Pending) != 1 || d.Pending[0].ApprovalID != "apr_2" || d.Offset == "" {
		t.Fatalf("after one of two: %s", body)
	}
	// Reading from the decision's offset returns the decision first.
	recs := readFrom(t, e, d.Offset)
	if len(recs) == 0 || recs[0].Entry == nil || recs[0].Entry.Type != record.EntryApprovalDecision {
		t.Fatalf("read from the decision's offset: %+v", recs)
	}
	first := recs[0].Entry
	var stored record.ApprovalDecisionPayload
	if err := json.Unmarshal(first.Payload, &stored); err != nil || stored.ApprovalID != "apr_1" || !stored.Approved || string(stored.Input) != `{"order":7,"amount":5}` {
		t.Fatalf("stored decision %s %v", first.Payload, err)
	}

	// The first decision stands.
	code, _, body = e.postJSON(t, path, `{"decisions":[{"approvalId":"apr_1","approved":false}]}`, nil)
	if code != http.StatusConflict || errorOf(t, body)["code"] != wire.CodeAlreadyDecided {
		t.Fatalf("decided twice: %d %s", code, body)
	}

	// The last one: nothing pending, the submission is handed back to run.
	before := e.admitted.Load()
	code, _, body = e.postJSON(t, path, `{"decisions":[{"approvalId":"`+reqs[1].ApprovalID+`","approved":false,"reason":"not this customer"}]}`, nil)
	if code != http.StatusAccepted {
		t.Fatalf("decide the last: %d %s", code, body)
	}
	if err := json.Unmarshal(body, &d); err != nil || len(d.Pending) != 0 {
		t.Fatalf("after the last: %s %v", body, err)
	}
	if e.admitted.Load() != before+1 {
		t.Fatalf("the outbox was not kicked for the resumed submission")
	}
	code, _, body = e.postJSON(t, path, `{"decisions":[{"approvalId":"apr_2","approved":true}]}`, nil)
	if code != http.StatusConflict || errorOf(t, body)["code"] != wire.CodeNotWaiting {
		t.Fatalf("after every decision: %d %s", code, body)
	}
}

// The refusals, in the documented order: each row is refused with its
// own code even when the rows below it would refuse it too.
func TestApprovalsRefusalOrder(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	acc, _ := waitingSubmission(t, e)
	idle, err := e.c.Deliver(ctx, "echo", "i1", wire.DeliverRequest{Message: wire.Message{Body: "x"}, Session: "other"}, "")
	if err != nil {
		t.Fatal(err)
	}
	waiting := "/agents/echo/i1/submissions/" + acc.SubmissionID + "/approvals"
	for _, c := range []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"unknown submission", "/agents/echo/i1/submissions/sub_nope/approvals", `nonsense`, 404, wire.CodeNotFound},
		{"another instance's", "/agents/echo/i2/submissions/" + acc.SubmissionID + "/approvals", `{"decisions":[{"approvalId":"apr_1","approved":true}]}`, 404, wire.CodeNotFound},
		{"unknown agent", "/agents/nope/i1/submissions/" + acc.SubmissionID + "/approvals", `{"decisions":[{"approvalId":"apr_1","approved":true}]}`, 404, wire.CodeNotFound},
		{"not waiting, unknown approval too", "/agents/echo/i1/submissions/" + idle.SubmissionID + "/approvals", `{"decisions":[{"approvalId":"apr_nope","approved":true}]}`, 409, wire.CodeNotWaiting},
		{"not waiting, malformed too", "/agents/echo/i1/submissions/" + idle.SubmissionID + "/approvals", `{`, 409, wire.CodeNotWaiting},
		{"unknown approval", waiting, `{"decisions":[{"approvalId":"apr_nope","approved":true}]}`, 404, wire.CodeNotFound},
		{"unknown approval, malformed too", waiting, `{"decisions":[{"approvalId":"apr_nope"}]}`, 404, wire.CodeNotFound},
		{"not JSON", waiting, `{"decisions":`, 400, wire.CodeBadRequest},
		{"decisions not a list", waiting, `{"decisions":{"approvalId":"apr_1"}}`, 400, wire.CodeBadRequest},
		{"no decisions", waiting, `{}`, 400, wire.CodeBadRequest},
		{"empty decisions", waiting, `{"decisions":[]}`, 400, wire.CodeBadRequest},
		{"approved missing", waiting, `{"decisions":[{"approvalId":"apr_1"}]}`, 400, wire.CodeBadRequest},
		{"approved not a boolean", waiting, `{"decisions":[{"approvalId":"apr_1","approved":"yes"}]}`, 400, wire.CodeBadRequest},
		{"unknown field", waiting, `{"decisions":[{"approvalId":"apr_1","approved":true,"note":"x"}]}`, 400, wire.CodeBadRequest},
		{"input with a denial", waiting, `{"decisions":[{"approvalId":"apr_1","approved":false,"input":{}}]}`, 400, wire.CodeBadRequest},
		{"input not an object", waiting, `{"decisions":[{"approvalId":"apr_1","approved":true,"input":[1]}]}`, 400, wire.CodeBadRequest},
		{"the same approval twice", waiting, `{"decisions":[{"approvalId":"apr_1","approved":true},{"approvalId":"apr_1","approved":false}]}`, 400, wire.CodeBadRequest},
	} {
		code, _, body := e.postJSON(t, c.path, c.body, nil)
		if code != c.status || errorOf(t, body)["code"] != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, code, body, c.status, c.code)
		}
	}
	// Nothing of that was stored: both approvals still pending.
	s, err := e.c.Submission(ctx, "echo", "i1", acc.SubmissionID, 0)
	if err != nil || len(s.Pending) != 2 {
		t.Fatalf("after the refusals: %+v %v", s, err)
	}
}

func TestApprovalsIdempotent(t *testing.T) {
	e := newEnv(t)
	acc, _ := waitingSubmission(t, e)
	path := "/agents/echo/i1/submissions/" + acc.SubmissionID + "/approvals"
	body := `{"decisions":[{"approvalId":"apr_1","approved":true},{"approvalId":"apr_2","approved":true}]}`
	key := map[string]string{"Idempotency-Key": "decide-1"}
	code, _, first := e.postJSON(t, path, body, key)
	if code != http.StatusAccepted {
		t.Fatalf("first: %d %s", code, first)
	}
	code, h, again := e.postJSON(t, path, body, key)
	if code != http.StatusAccepted || h.Get("Idempotent-Replayed") != "true" || string(again) != string(first) {
		t.Fatalf("retry: %d %q %s (first %s)", code, h.Get("Idempotent-Replayed"), again, first)
	}
	code, _, other := e.postJSON(t, path, `{"decisions":[{"approvalId":"apr_1","approved":false}]}`, key)
	if code != http.StatusUnprocessableEntity || errorOf(t, other)["code"] != wire.CodeIdempotencyKeyReused {
		t.Fatalf("key reused: %d %s", code, other)
	}
	// One batch of decisions in the stream.
	n := 0
	for _, r := range readFrom(t, e, record.Start) {
		if r.Entry != nil && r.Entry.Type == record.EntryApprovalDecision {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d decisions stored, want 2", n)
	}
}
