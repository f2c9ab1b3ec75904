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

// convlog approve and deny against the real service: the model calls a
// tool that needs approval; `approve --input` resumes it with edited
// arguments (the tool sees them), `deny --reason` never calls the tool.
func TestCLIApproveDeny(t *testing.T) {
	bin := buildCLI(t)
	var mu sync.Mutex
	var calls []string
	tool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, string(b))
		mu.Unlock()
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer tool.Close()
	call := func(id string) fakeopenai.Response {
		return fakeopenai.Response{Chunks: []fakeopenai.Chunk{{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, ID: id, Name: "refund", Arguments: `{"order":7}`}}}}}
	}
	model := fakeopenai.New(call("call_1"), fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "done"}}},
		call("call_2"), fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "not done"}}})
	defer model.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "convlog.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`agents:
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
	addr := freeAddr(t)
	serveCLIProcess(t, bin, addr, filepath.Join(dir, "data"), "--config", cfg)
	c := &client.Client{BaseURL: "http://" + addr}
	server := "--server=http://" + addr

	waiting := func(text string) record.Submission {
		t.Helper()
		acc, err := c.Deliver(context.Background(), "support", "u", wire.DeliverRequest{Message: wire.Message{Body: text}}, "")
		if err != nil {
			t.Fatal(err)
		}
		var s record.Submission
		check.For(t, time.Minute, 10*time.Millisecond, func() error {
			if s, err = c.Submission(context.Background(), "support", "u", acc.SubmissionID, 5*time.Second); err != nil || !s.Waiting() {
				return fmt.Errorf("not waiting: %+v %v", s, err)
			}
			return nil
		})
		return s
	}
	settled := func(id string) record.Submission {
		t.Helper()
		var s record.Submission
		check.For(t, time.Minute, 10*time.Millisecond, func() error {
			var err error
			if s, err = c.Submission(context.Background(), "support", "u", id, 5*time.Second); err != nil || !s.Status.Terminal() {
				return fmt.Errorf("not settled: %+v %v", s, err)
			}
			return nil
		})
		return s
	}

	s := waiting("refund 7")
	if _, stderr, code := runCLI(t, bin, "approve", server, "support/u", s.ID, "--input", `{"order":7,"amount":5}`); code != 0 || !strings.Contains(stderr, "approved 1; 0 still pending") {
		t.Fatalf("approve: %d %s", code, stderr)
	}
	if got := settled(s.ID); got.Status != record.StatusCompleted {
		t.Fatalf("after approve: %+v", got)
	}
	mu.Lock()
	if len(calls) != 1 || calls[0] != `{"order":7,"amount":5}` {
		t.Fatalf("tool calls %q", calls)
	}
	mu.Unlock()
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
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 {
		t.Fatalf("a denied call reached the tool: %q", calls)
	}
}
