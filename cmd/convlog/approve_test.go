package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker/openaiagent/fakeopenai"
)

// approvalRig is a real service (a child process) whose openai agent has
// one tool, refund, that needs approval; the tool server counts its calls.
type approvalRig struct {
	t      *testing.T
	bin    string
	addr   string
	data   string
	cfg    string
	c      *client.Client
	server string // the CLI's --server flag
	mu     sync.Mutex
	calls  []string
	// block, when set, holds every tool call until it is closed.
	block chan struct{}
	// called is told of each call as it arrives.
	called chan struct{}
}

func refundCall(id string) fakeopenai.Response {
	return fakeopenai.Response{Chunks: []fakeopenai.Chunk{{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, ID: id, Name: "refund", Arguments: `{"order":7}`}}}}}
}

func newApprovalRig(t *testing.T, responses ...fakeopenai.Response) *approvalRig {
	r := &approvalRig{t: t, bin: buildCLI(t), called: make(chan struct{}, 16)}
	tool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.calls = append(r.calls, string(b))
		block := r.block
		r.mu.Unlock()
		r.called <- struct{}{}
		if block != nil {
			select {
			case <-block:
			case <-req.Context().Done():
				return
			}
		}
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(tool.Close)
	model := fakeopenai.New(responses...)
	t.Cleanup(model.Close)
	dir := t.TempDir()
	r.cfg = filepath.Join(dir, "convlog.yaml")
	if err := os.WriteFile(r.cfg, []byte(fmt.Sprintf(`agents:
  - name: support
    kind: openai
    baseURL: %s
    model: m
    apiKeyEnv: FAKE_OPENAI_KEY
    tools:
      - {name: refund, url: %q, allowPrivate: true, approval: required}
`, model.BaseURL(), tool.URL)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_OPENAI_KEY", "sk-cli")
	r.addr, r.data = freeAddr(t), filepath.Join(dir, "data")
	r.c = &client.Client{BaseURL: "http://" + r.addr}
	r.server = "--server=http://" + r.addr
	return r
}

func (r *approvalRig) serve() *served {
	return serveCLIProcess(r.t, r.bin, r.addr, r.data, "--config", r.cfg)
}

func (r *approvalRig) toolCalls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// waiting delivers text and returns its submission once it waits.
func (r *approvalRig) waiting(text string) record.Submission {
	r.t.Helper()
	acc, err := r.c.Deliver(context.Background(), "support", "u", wire.DeliverRequest{Message: wire.Message{Body: text}}, "")
	if err != nil {
		r.t.Fatal(err)
	}
	return r.until(acc.SubmissionID, record.Submission.Waiting)
}

// until polls the submission until cond holds.
func (r *approvalRig) until(id string, cond func(record.Submission) bool) record.Submission {
	r.t.Helper()
	var s record.Submission
	check.For(r.t, time.Minute, 10*time.Millisecond, func() error {
		var err error
		if s, err = r.c.Submission(context.Background(), "support", "u", id, 5*time.Second); err != nil || !cond(s) {
			return fmt.Errorf("submission %+v %v", s, err)
		}
		return nil
	})
	return s
}

func terminal(s record.Submission) bool { return s.Status.Terminal() }

// convlog approve and deny against the real service: the model calls a
// tool that needs approval; `approve --input` resumes it with edited
// arguments (the tool sees them), `deny --reason` never calls the tool.
func TestCLIApproveDeny(t *testing.T) {
	r := newApprovalRig(t, refundCall("call_1"), fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "done"}}},
		refundCall("call_2"), fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "not done"}}})
	r.serve()
	bin, server := r.bin, r.server
	waiting := r.waiting
	settled := func(id string) record.Submission { return r.until(id, terminal) }

	s := waiting("refund 7")
	if _, stderr, code := runCLI(t, bin, "approve", server, "support/u", s.ID, "--input", `{"order":7,"amount":5}`); code != 0 || !strings.Contains(stderr, "approved 1; 0 still pending") {
		t.Fatalf("approve: %d %s", code, stderr)
	}
	if got := settled(s.ID); got.Status != record.StatusCompleted {
		t.Fatalf("after approve: %+v", got)
	}
	if calls := r.toolCalls(); len(calls) != 1 || calls[0] != `{"order":7,"amount":5}` {
		t.Fatalf("tool calls %q", calls)
	}
	// Nothing left to decide: a clear refusal, exit 1.
	if _, stderr, code := runCLI(t, bin, "approve", server, "support/u", s.ID); code != 1 || !strings.Contains(stderr, "waits for no approval") {
		t.Fatalf("approve again: %d %s", code, stderr)
	}

	s = waiting("refund 8")
	if _, stderr, code := runCLI(t, bin, "deny", server, "support/u", s.ID, s.Pending[0].ApprovalID, "--reason", "over the limit"); code != 0 || !strings.Contains(stderr, "denied 1") {
		t.Fatalf("deny: %d %s", code, stderr)
	}
	if got := settled(s.ID); got.Status != record.StatusCompleted {
		t.Fatalf("after deny: %+v", got)
	}
	if calls := r.toolCalls(); len(calls) != 1 {
		t.Fatalf("a denied call reached the tool: %q", calls)
	}
}

// kill -9 while the submission waits, and right after the decision's
// 202: the wait survives the kill, the decision is applied once, the tool
// is called at most once per call, and each submission settles exactly
// once (completed, or failed interrupted when the kill cut the resumed
// turn short: a cut tool call is never re-run).
func TestApprovalSurvivesKill9(t *testing.T) {
	r := newApprovalRig(t, refundCall("call_1"), fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "done"}}},
		refundCall("call_2"), fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "done too"}}})
	srv := r.serve()
	s := r.waiting("refund 7")
	srv.kill()
	srv = r.serve()
	if again := r.until(s.ID, record.Submission.Waiting); len(again.Pending) != 1 || again.Pending[0].ApprovalID != s.Pending[0].ApprovalID {
		t.Fatalf("after kill -9 while waiting: %+v", again)
	}
	if len(r.toolCalls()) != 0 {
		t.Fatal("the tool ran before its approval")
	}
	if _, err := r.c.Decide(context.Background(), "support", "u", s.ID, []wire.Decision{{ApprovalID: s.Pending[0].ApprovalID, Approved: true}}, "k1"); err != nil {
		t.Fatal(err)
	}
	if got := r.until(s.ID, terminal); got.Status != record.StatusCompleted {
		t.Fatalf("after the approval: %+v", got)
	}
	if n := len(r.toolCalls()); n != 1 {
		t.Fatalf("%d tool calls, want 1", n)
	}

	s2 := r.waiting("refund 8")
	if _, err := r.c.Decide(context.Background(), "support", "u", s2.ID, []wire.Decision{{ApprovalID: s2.Pending[0].ApprovalID, Approved: true}}, "k2"); err != nil {
		t.Fatal(err)
	}
	srv.kill() // right after the 202: before, during or after the resumed turn
	r.serve()
	// The same decision again (a client retrying after the kill) changes
	// nothing: its key replays, or the submission no longer waits.
	if _, err := r.c.Decide(context.Background(), "support", "u", s2.ID, []wire.Decision{{ApprovalID: s2.Pending[0].ApprovalID, Approved: true}}, "k2"); err != nil && !client.IsCode(err, wire.CodeNotWaiting) {
		t.Fatalf("retry after the kill: %v", err)
	}
	got := r.until(s2.ID, terminal)
	interrupted := got.Status == record.StatusFailed && got.Error != nil && got.Error.Code == "interrupted"
	if got.Status != record.StatusCompleted && !interrupted {
		t.Fatalf("after kill -9 past the decision: %+v", got)
	}
	if n := len(r.toolCalls()); n < 1 || n > 2 {
		t.Fatalf("%d tool calls in all, want the first one and at most one more", n)
	}
	recs, err := r.c.Read(context.Background(), "support", "u", "", record.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	settlements := map[string]int{}
	for _, b := range recs.Batches {
		rs, err := b.Records.Decode()
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range rs {
			if rec.Entry != nil && rec.Entry.Type == record.EntrySettlement {
				settlements[rec.Entry.SubmissionID]++
			}
		}
	}
	if settlements[s.ID] != 1 || settlements[s2.ID] != 1 {
		t.Fatalf("settlements %v", settlements)
	}
	t.Logf("after the kill past the decision: %s, %d tool calls in all", got.Status, len(r.toolCalls()))
}

// kill -9 during the approved tool call: the call is never made again
// (the tool counts one), and the submission settles failed interrupted,
// once.
func TestApprovalKill9DuringTheToolCall(t *testing.T) {
	r := newApprovalRig(t, refundCall("call_1"), fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "never"}}})
	r.block = make(chan struct{})
	defer close(r.block)
	srv := r.serve()
	s := r.waiting("refund 7")
	if _, err := r.c.Decide(context.Background(), "support", "u", s.ID, []wire.Decision{{ApprovalID: s.Pending[0].ApprovalID, Approved: true}}, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.called:
	case <-time.After(time.Minute):
		t.Fatal("the approved call never reached the tool")
	}
	srv.kill()
	r.serve()
	got := r.until(s.ID, terminal)
	if got.Status != record.StatusFailed || got.Error == nil || got.Error.Code != "interrupted" {
		t.Fatalf("after kill -9 during the tool call: %+v", got)
	}
	if n := len(r.toolCalls()); n != 1 {
		t.Fatalf("%d tool calls, want 1: a cut call is not re-run", n)
	}
}
