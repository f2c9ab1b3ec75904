package service

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/servicetest"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker/openaiagent/fakeopenai"
)

// toolServer is a tool's URL that counts its calls and keeps their bodies.
type toolServer struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
}

func newToolServer(t *testing.T) *toolServer {
	ts := &toolServer{}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ts.mu.Lock()
		ts.bodies = append(ts.bodies, string(b))
		ts.mu.Unlock()
		fmt.Fprint(w, `{"refunded":true}`)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func (ts *toolServer) calls() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]string(nil), ts.bodies...)
}

func approvalService(t *testing.T, model *fakeopenai.Server, tool *toolServer) (*Service, *client.Client) {
	t.Setenv("FAKE_OPENAI_KEY", "sk-e2e")
	// No sweep to rescue a resumption whose doorbell was lost.
	agents := withConfig(t, fmt.Sprintf(`agents:
  - name: support
    kind: openai
    baseURL: %s
    model: gpt-4o-mini
    apiKeyEnv: FAKE_OPENAI_KEY
    tools:
      - name: refund
        description: refund an order
        parameters: {type: object, properties: {order: {type: integer}}}
        url: %s
        allowPrivate: true
        approval: required
`, model.BaseURL(), tool.URL))
	return testService(t, func(c *Config) { agents(c); c.SweepInterval = time.Hour })
}

func refundCall(id string) fakeopenai.Response {
	return fakeopenai.Response{Chunks: []fakeopenai.Chunk{
		{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, ID: id, Name: "refund", Arguments: `{"order":7}`}}},
	}}
}

// waitFor long-polls the submission until it waits for approvals or
// settles.
func waitFor(t *testing.T, c *client.Client, id string) record.Submission {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		s, err := c.Submission(ctx, "support", "u1", id, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if s.Status.Terminal() || s.Waiting() {
			return s
		}
	}
}

func decide(t *testing.T, svc *Service, id, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+svc.Addr()+"/agents/support/u1/submissions/"+id+"/approvals", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The whole flow over HTTP with the real openai agent: the model calls a
// tool that needs approval, the turn stops without calling it and the
// submission waits; an approval with edited input resumes the same
// submission, the tool is called once with the edit, the model answers,
// and the submission settles once. A denial gives the model an error
// result and never calls the tool.
func TestApprovalEndToEnd(t *testing.T) {
	model := fakeopenai.New(
		refundCall("call_r1"),
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "Refunded 5."}}},
		refundCall("call_r2"),
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "I may not refund that."}}},
	)
	defer model.Close()
	tool := newToolServer(t)
	svc, c := approvalService(t, model, tool)

	acc := servicetest.Deliver(t, c, "support", "u1", "s", "Refund order 7, please")
	s := waitFor(t, c, acc.SubmissionID)
	if s.Status != record.StatusInputRequired || len(s.Pending) != 1 || s.Pending[0].ToolName != "refund" || s.Pending[0].ToolCallID != "call_r1" {
		t.Fatalf("waiting: %+v", s)
	}
	if n := len(tool.calls()); n != 0 {
		t.Fatalf("the tool was called %d times before its approval", n)
	}
	decided := time.Now()
	// Through the Go client.
	d, err := c.Decide(context.Background(), "support", "u1", acc.SubmissionID,
		[]wire.Decision{{ApprovalID: s.Pending[0].ApprovalID, Approved: true, Input: json.RawMessage(`{"order":7,"amount":5}`)}}, "approve-1")
	if err != nil || d.SubmissionID != acc.SubmissionID || len(d.Pending) != 0 || d.Offset == "" {
		t.Fatalf("approve: %+v %v", d, err)
	}
	if s = waitFor(t, c, acc.SubmissionID); s.Status != record.StatusCompleted {
		t.Fatalf("after the approval: %+v", s)
	}
	t.Logf("approval to settlement: %v", time.Since(decided))
	if calls := tool.calls(); len(calls) != 1 || calls[0] != `{"order":7,"amount":5}` {
		t.Fatalf("tool calls %q", calls)
	}
	recs := servicetest.ReadUntilSettled(t, c, "support", "u1", "s", record.Start, acc.SubmissionID)
	var types []string
	settlements := 0
	for _, r := range recs {
		if r.Entry == nil {
			continue
		}
		types = append(types, r.Entry.Type)
		if r.Entry.Type == record.EntrySettlement {
			settlements++
		}
	}
	if got := strings.Join(types, " "); got != "user_message assistant_message approval_request approval_decision tool_result assistant_message settlement" || settlements != 1 {
		t.Fatalf("records: %s", got)
	}

	// A denial: the tool is not called, the model sees why.
	acc2 := servicetest.Deliver(t, c, "support", "u1", "s", "And order 8?")
	s = waitFor(t, c, acc2.SubmissionID)
	if !s.Waiting() {
		t.Fatalf("second: %+v", s)
	}
	second := s.Pending[0].ApprovalID
	decided = time.Now()
	if code, body := decide(t, svc, acc2.SubmissionID, `{"decisions":[{"approvalId":"`+second+`","approved":false,"reason":"over the limit"}]}`); code != http.StatusAccepted {
		t.Fatalf("deny: %d %s", code, body)
	}
	if s = waitFor(t, c, acc2.SubmissionID); s.Status != record.StatusCompleted {
		t.Fatalf("after the denial: %+v", s)
	}
	t.Logf("denial to settlement: %v", time.Since(decided))
	if n := len(tool.calls()); n != 1 {
		t.Fatalf("a denied call reached the tool: %d calls", n)
	}
	reqs := model.Requests()
	if len(reqs) != 4 {
		t.Fatalf("%d model requests", len(reqs))
	}
	msgs := reqs[3].Messages()
	last := msgs[len(msgs)-1]
	if last["role"] != "tool" || !strings.Contains(fmt.Sprint(last["content"]), "over the limit") {
		t.Fatalf("the model's view of the denial: %v", last)
	}
	if code, body := decide(t, svc, acc2.SubmissionID, `{"decisions":[{"approvalId":"`+second+`","approved":true}]}`); code != http.StatusConflict || !strings.Contains(body, "not_waiting") {
		t.Fatalf("decided after settling: %d %s", code, body)
	}
}

// A waiting submission ends with the session's changes: an abort settles
// it aborted, and a later decision is refused.
func TestApprovalAbortWhileWaiting(t *testing.T) {
	model := fakeopenai.New(refundCall("call_a1"))
	defer model.Close()
	tool := newToolServer(t)
	svc, c := approvalService(t, model, tool)
	acc := servicetest.Deliver(t, c, "support", "u1", "s", "Refund order 7")
	s := waitFor(t, c, acc.SubmissionID)
	if !s.Waiting() {
		t.Fatalf("waiting: %+v", s)
	}
	if a, err := c.Abort(context.Background(), "support", "u1", acc.SubmissionID); err != nil || a.Status != record.StatusAborted {
		t.Fatalf("abort while waiting: %+v %v", a, err)
	}
	if code, body := decide(t, svc, acc.SubmissionID, `{"decisions":[{"approvalId":"`+s.Pending[0].ApprovalID+`","approved":true}]}`); code != http.StatusConflict || !strings.Contains(body, "not_waiting") {
		t.Fatalf("decided after the abort: %d %s", code, body)
	}
	if n := len(tool.calls()); n != 0 {
		t.Fatalf("tool called %d times", n)
	}
}
