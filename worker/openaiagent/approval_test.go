package openaiagent_test

import (
	"context"
	"encoding/json"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/projection"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agenttest"
	"github.com/convlog/convlog/worker/openaiagent"
	"github.com/convlog/convlog/worker/openaiagent/fakeopenai"
)

// toolServer counts the calls of each tool (by path) and keeps their
// bodies.
type toolServer struct {
	*httptest.Server
	mu     sync.Mutex
	bodies map[string][]string
}

func newToolServer(t *testing.T) *toolServer {
	ts := &toolServer{bodies: map[string][]string{}}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ts.mu.Lock()
		ts.bodies[r.URL.Path] = append(ts.bodies[r.URL.Path], string(b))
		ts.mu.Unlock()
		io.WriteString(w, `{"ok":"`+strings.TrimPrefix(r.URL.Path, "/")+`"}`)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func (ts *toolServer) calls(name string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]string(nil), ts.bodies["/"+name]...)
}

func (ts *toolServer) tools() []openaiagent.Tool {
	return []openaiagent.Tool{
		{Name: "weather", URL: ts.URL + "/weather", AllowPrivate: true},
		{Name: "refund", URL: ts.URL + "/refund", AllowPrivate: true, Approval: openaiagent.ApprovalRequired},
		{Name: "deploy", URL: ts.URL + "/deploy", AllowPrivate: true, Approval: openaiagent.ApprovalRequired},
	}
}

func callsChunk(calls ...fakeopenai.ToolCallDelta) fakeopenai.Response {
	for i := range calls {
		calls[i].Index = i
	}
	return fakeopenai.Response{Chunks: []fakeopenai.Chunk{{ToolCalls: calls}}}
}

func summary(evs []worker.Event) string {
	var out []string
	for _, ev := range evs {
		switch ev.Type {
		case worker.EventToolInputDelta:
			continue
		case worker.EventToolStarted, worker.EventApprovalRequested:
			out = append(out, ev.Type+":"+ev.ID+":"+ev.Name+":"+string(ev.Args))
		case worker.EventToolEnded:
			e := ""
			if ev.IsError {
				e = "!"
			}
			out = append(out, ev.Type+e+":"+ev.ID+":"+string(ev.Content))
		case worker.EventText:
			out = append(out, "text:"+ev.Delta)
		default:
			out = append(out, ev.Type)
		}
	}
	return strings.Join(out, " | ")
}

func run(t *testing.T, a worker.Agent, prompt worker.Prompt) []worker.Event {
	t.Helper()
	evs, err := agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/i/s"}, prompt, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := agenttest.CheckTerminal(evs); err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if err := agenttest.CheckJSON(ev); err != nil {
			t.Fatal(err)
		}
	}
	return evs
}

// A call of a tool that requires approval is not made: the turn asks and
// completes, without calling the model again. A none tool of the same
// step runs at once; two held calls are both asked for, in model order.
func TestApprovalHeld(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls []fakeopenai.ToolCallDelta
		want  string
		ran   map[string]int
	}{
		{"required", []fakeopenai.ToolCallDelta{{ID: "c1", Name: "refund", Arguments: `{"amount":5}`}},
			`tool_started:c1:refund:{"amount":5} | approval_requested:c1:refund:{"amount":5} | completed`,
			map[string]int{"refund": 0}},
		{"mixed", []fakeopenai.ToolCallDelta{{ID: "c1", Name: "weather", Arguments: `{}`}, {ID: "c2", Name: "refund", Arguments: `{"amount":5}`}},
			`tool_started:c1:weather:{} | tool_ended:c1:{"ok":"weather"} | tool_started:c2:refund:{"amount":5} | approval_requested:c2:refund:{"amount":5} | completed`,
			map[string]int{"weather": 1, "refund": 0}},
		{"two held", []fakeopenai.ToolCallDelta{{ID: "c1", Name: "refund", Arguments: `{"amount":5}`}, {ID: "c2", Name: "deploy", Arguments: `{"env":"prod"}`}},
			`tool_started:c1:refund:{"amount":5} | tool_started:c2:deploy:{"env":"prod"} | approval_requested:c1:refund:{"amount":5} | approval_requested:c2:deploy:{"env":"prod"} | completed`,
			map[string]int{"refund": 0, "deploy": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newToolServer(t)
			srv := fakeopenai.New(callsChunk(tc.calls...), fakeopenai.Response{Chunks: words("should not be asked")})
			defer srv.Close()
			a := agent(srv, userHistory("refund me"))
			a.Tools = ts.tools()
			if got := summary(run(t, a, worker.Prompt{Text: "refund me"})); got != tc.want {
				t.Fatalf("events\n got %s\nwant %s", got, tc.want)
			}
			for name, n := range tc.ran {
				if got := len(ts.calls(name)); got != n {
					t.Fatalf("%s called %d times, want %d", name, got, n)
				}
			}
			if n := len(srv.Requests()); n != 1 {
				t.Fatalf("%d model requests, want 1", n)
			}
		})
	}
}

// heldHistory is the conversation as the log holds it after a turn held
// calls: the user's message, then the assistant's tool calls without
// results (and the none tool's result).
func heldHistory(parts ...projection.Part) openaiagent.History {
	return openaiagent.HistoryFunc(func(context.Context, worker.Scope) ([]projection.Message, error) {
		return []projection.Message{
			{Role: "user", Parts: []projection.Part{{Type: "text", Text: "refund me"}}},
			{Role: "assistant", Parts: parts},
		}, nil
	})
}

func heldPart(id, name, input string) projection.Part {
	return projection.Part{Type: "tool", ToolCallID: id, ToolName: name, State: projection.StateInputAvailable, Input: json.RawMessage(input)}
}

// toolMessages are the tool messages of a model request, as id:content.
func toolMessages(req fakeopenai.Request) string {
	var out []string
	for _, m := range req.Messages() {
		if m["role"] == "tool" {
			out = append(out, m["tool_call_id"].(string)+":"+m["content"].(string))
		}
	}
	return strings.Join(out, " | ")
}

// A resumed turn makes each approved call once (with the edited input
// when there is one) and gives each denied call the denial, in the
// decisions' order, without a second tool_started; the model then sees
// every result as its tool message and continues.
func TestApprovalResume(t *testing.T) {
	for _, tc := range []struct {
		name      string
		parts     []projection.Part
		decisions []worker.Decision
		want      string
		bodies    map[string][]string
		toolMsgs  string
	}{
		{"approved", []projection.Part{heldPart("c1", "refund", `{"amount":5}`)},
			[]worker.Decision{{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{"amount":5}`), Approved: true}},
			`tool_ended:c1:{"ok":"refund"} | text:done | completed`,
			map[string][]string{"refund": {`{"amount":5}`}},
			`c1:{"ok":"refund"}`},
		{"approved with edited input", []projection.Part{heldPart("c1", "refund", `{"amount":5}`)},
			[]worker.Decision{{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{"amount":5}`), Approved: true, Input: json.RawMessage(`{"amount":3}`)}},
			`tool_ended:c1:{"ok":"refund"} | text:done | completed`,
			map[string][]string{"refund": {`{"amount":3}`}},
			`c1:{"ok":"refund"}`},
		{"denied", []projection.Part{heldPart("c1", "refund", `{"amount":5}`)},
			[]worker.Decision{{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{"amount":5}`), Reason: "too much"}},
			`tool_ended!:c1:{"error":"denied","reason":"too much"} | text:done | completed`,
			map[string][]string{"refund": nil},
			`c1:{"error":"denied","reason":"too much"}`},
		{"denied without a reason", []projection.Part{heldPart("c1", "refund", `{"amount":5}`)},
			[]worker.Decision{{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{"amount":5}`)}},
			`tool_ended!:c1:{"error":"denied","reason":"denied by a person"} | text:done | completed`,
			map[string][]string{"refund": nil},
			`c1:{"error":"denied","reason":"denied by a person"}`},
		{"timed out", []projection.Part{heldPart("c1", "refund", `{"amount":5}`)},
			[]worker.Decision{{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{"amount":5}`), Reason: worker.ReasonTimeout}},
			`tool_ended!:c1:{"error":"denied","reason":"timeout"} | text:done | completed`,
			map[string][]string{"refund": nil},
			`c1:{"error":"denied","reason":"timeout"}`},
		{"mixed step, two decisions", []projection.Part{
			{Type: "tool", ToolCallID: "c0", ToolName: "weather", State: projection.StateOutputAvailable, Input: json.RawMessage(`{}`), Output: json.RawMessage(`{"ok":"weather"}`)},
			heldPart("c1", "refund", `{"amount":5}`), heldPart("c2", "deploy", `{"env":"prod"}`)},
			[]worker.Decision{
				{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{"amount":5}`), Reason: "no"},
				{ApprovalID: "ap2", ToolCallID: "c2", ToolName: "deploy", Args: json.RawMessage(`{"env":"prod"}`), Approved: true}},
			`tool_ended!:c1:{"error":"denied","reason":"no"} | tool_ended:c2:{"ok":"deploy"} | text:done | completed`,
			map[string][]string{"refund": nil, "deploy": {`{"env":"prod"}`}, "weather": nil},
			`c0:{"ok":"weather"} | c1:{"error":"denied","reason":"no"} | c2:{"ok":"deploy"}`},
		{"result already stored is not made again", []projection.Part{
			{Type: "tool", ToolCallID: "c1", ToolName: "refund", State: projection.StateOutputAvailable, Input: json.RawMessage(`{"amount":5}`), Output: json.RawMessage(`{"ok":"refund"}`)}},
			[]worker.Decision{{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{"amount":5}`), Approved: true}},
			`text:done | completed`,
			map[string][]string{"refund": nil},
			`c1:{"ok":"refund"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newToolServer(t)
			srv := fakeopenai.New(fakeopenai.Response{Chunks: words("done")})
			defer srv.Close()
			a := agent(srv, heldHistory(tc.parts...))
			a.Tools = ts.tools()
			got := summary(run(t, a, worker.Prompt{Text: "refund me", Resume: &worker.Resume{Decisions: tc.decisions}}))
			if got != tc.want {
				t.Fatalf("events\n got %s\nwant %s", got, tc.want)
			}
			for name, want := range tc.bodies {
				if got := ts.calls(name); strings.Join(got, ",") != strings.Join(want, ",") {
					t.Fatalf("%s called with %q, want %q", name, got, want)
				}
			}
			reqs := srv.Requests()
			if len(reqs) != 1 {
				t.Fatalf("%d model requests", len(reqs))
			}
			if got := toolMessages(reqs[0]); got != tc.toolMsgs {
				b, _ := json.Marshal(reqs[0].Messages())
				t.Fatalf("tool messages\n got %s\nwant %s\nall %s", got, tc.toolMsgs, b)
			}
			ms := reqs[0].Messages()
			if len(ms) < 2 || ms[0]["role"] != "user" || ms[1]["role"] != "assistant" {
				t.Fatalf("messages %+v", ms)
			}
		})
	}
}

// A resumed turn whose context ends during the approved call stops
// without a terminal and without calling the model.
func TestApprovalResumeCancelled(t *testing.T) {
	hit := make(chan struct{}, 1)
	tool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // the server notices the client going only once the body is read
		hit <- struct{}{}
		<-r.Context().Done()
	}))
	defer tool.Close()
	srv := fakeopenai.New(fakeopenai.Response{Chunks: words("done")})
	defer srv.Close()
	a := agent(srv, heldHistory(heldPart("c1", "refund", `{}`)))
	a.Tools = []openaiagent.Tool{{Name: "refund", URL: tool.URL, AllowPrivate: true, Approval: openaiagent.ApprovalRequired}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan []worker.Event, 1)
	go func() {
		var evs []worker.Event
		for ev := range a.Invoke(ctx, worker.Scope{Session: "a/i/s"}, worker.Prompt{Resume: &worker.Resume{Decisions: []worker.Decision{{ToolCallID: "c1", ToolName: "refund", Args: json.RawMessage(`{}`), Approved: true}}}}) {
			evs = append(evs, ev)
		}
		done <- evs
	}()
	<-hit
	cancel()
	var evs []worker.Event
	check.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		select {
		case evs = <-done:
			return nil
		default:
			return context.DeadlineExceeded
		}
	})
	if len(evs) != 0 || len(srv.Requests()) != 0 {
		t.Fatalf("events %+v, %d model requests", evs, len(srv.Requests()))
	}
}

// The conformance kit's approval check: the model asks for the refund,
// and after either decision it answers. (Two fakes, since the kit's
// other checks would use up one script: a first turn of "refund me"
// reaches the asking model, any other turn the answering one.)
func TestApprovalConformance(t *testing.T) {
	ts := newToolServer(t)
	asking := fakeopenai.New(callsChunk(fakeopenai.ToolCallDelta{ID: "c1", Name: "refund", Arguments: `{"amount":5}`}))
	defer asking.Close()
	answering := fakeopenai.New(fakeopenai.Response{Chunks: words("done")})
	defer answering.Close()
	ask := agent(asking, userHistory("refund me"))
	ask.Tools = ts.tools()
	answer := agent(answering, heldHistory(heldPart("c1", "refund", `{"amount":5}`)))
	answer.Tools = ts.tools()
	a := worker.AgentFunc(func(ctx context.Context, scope worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
		if p.Text == "refund me" && p.Resume == nil {
			return ask.Invoke(ctx, scope, p)
		}
		return answer.Invoke(ctx, scope, p)
	})
	agenttest.Run(t, a, agenttest.Options{Prompt: worker.Prompt{Text: "hi"}, Approval: &worker.Prompt{Text: "refund me"}})
	if n := len(ts.calls("refund")); n != 1 {
		t.Fatalf("refund called %d times, want 1 (the approved resume)", n)
	}
}
