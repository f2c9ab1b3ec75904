package openaiagent_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/convlog/convlog/projection"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agenttest"
	"github.com/convlog/convlog/worker/openaiagent"
	"github.com/convlog/convlog/worker/openaiagent/fakeopenai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func userHistory(text string) openaiagent.History {
	return openaiagent.HistoryFunc(func(context.Context, worker.Scope) ([]projection.Message, error) {
		return []projection.Message{{Role: "user", Parts: []projection.Part{{Type: "text", Text: text}}}}, nil
	})
}

func agent(srv *fakeopenai.Server, h openaiagent.History) *openaiagent.Agent {
	return &openaiagent.Agent{
		BaseURL: srv.BaseURL(), APIKey: "sk-fake", Model: "gpt-4o-mini", History: h,
		Backoff: func(int) time.Duration { return time.Millisecond },
	}
}

func words(s string) []fakeopenai.Chunk {
	var out []fakeopenai.Chunk
	for _, w := range strings.SplitAfter(s, " ") {
		out = append(out, fakeopenai.Chunk{Content: w})
	}
	return out
}

func collect(t *testing.T, a worker.Agent) []worker.Event {
	t.Helper()
	evs, err := agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "hi"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := agenttest.CheckTerminal(evs); err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestConformance(t *testing.T) {
	srv := fakeopenai.New(fakeopenai.Response{Chunks: words("one two three four five six"), Delay: 20 * time.Millisecond})
	defer srv.Close()
	agenttest.Run(t, agent(srv, userHistory("hi")), agenttest.Options{Prompt: worker.Prompt{Text: "hi"}})
}

func TestStreamsTextAndThinking(t *testing.T) {
	srv := fakeopenai.New(fakeopenai.Response{Chunks: append([]fakeopenai.Chunk{{Reasoning: "hmm "}, {Reasoning: "ok"}}, words("Hello there")...)})
	defer srv.Close()
	a := agent(srv, userHistory("say hello"))
	a.System = "be brief"
	evs := collect(t, a)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.Type+":"+ev.Delta)
	}
	if strings.Join(got, "|") != "thinking:hmm |thinking:ok|text:Hello |text:there|completed:" {
		t.Fatalf("%v", got)
	}
	req := srv.Requests()[0]
	ms := req.Messages()
	if req.Body["model"] != "gpt-4o-mini" || req.Body["stream"] != true || len(ms) != 2 || ms[0]["role"] != "system" || ms[1]["content"] != "say hello" {
		t.Fatalf("request %+v", req.Body)
	}
	if req.Header.Get("Authorization") != "Bearer sk-fake" {
		t.Fatalf("auth %q", req.Header.Get("Authorization"))
	}
}

// The model calls a tool: its arguments stream as tool_input_delta, the
// call is POSTed to the tool's URL, and the model is called again with the
// result, which it answers.
func TestToolLoop(t *testing.T) {
	var toolBody atomic.Value
	tool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		toolBody.Store(string(b))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"tempC": 21}`)
	}))
	defer tool.Close()
	srv := fakeopenai.New(
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{
			{Content: "Let me check. "},
			{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, ID: "call_1", Name: "weather", Arguments: `{"city":`}}},
			{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, Arguments: `"Paris"}`}}},
		}},
		fakeopenai.Response{Chunks: words("It is 21C.")},
	)
	defer srv.Close()
	a := agent(srv, userHistory("weather in Paris?"))
	a.Tools = []openaiagent.Tool{{Name: "weather", Description: "current weather", Parameters: map[string]any{"type": "object"}, URL: tool.URL}}
	evs := collect(t, a)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	if strings.Join(types, " ") != "text tool_input_delta tool_input_delta tool_started tool_ended text text text completed" {
		t.Fatalf("%v", types)
	}
	if string(evs[3].Args) != `{"city":"Paris"}` || evs[3].ID != "call_1" || string(evs[4].Content) != `{"tempC": 21}` || evs[4].IsError {
		t.Fatalf("%+v %+v", evs[3], evs[4])
	}
	if toolBody.Load() != `{"city":"Paris"}` {
		t.Fatalf("tool got %v", toolBody.Load())
	}
	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	if tools, _ := reqs[0].Body["tools"].([]any); len(tools) != 1 {
		t.Fatalf("tools %+v", reqs[0].Body["tools"])
	}
	ms := reqs[1].Messages()
	if len(ms) != 3 || ms[1]["role"] != "assistant" || ms[2]["role"] != "tool" || ms[2]["tool_call_id"] != "call_1" || ms[2]["content"] != `{"tempC": 21}` {
		b, _ := json.Marshal(ms)
		t.Fatalf("second request messages %s", b)
	}
}

// The history is the active path: earlier tool calls and their results
// are sent back as assistant tool_calls and tool messages.
func TestHistoryWithTools(t *testing.T) {
	srv := fakeopenai.New(fakeopenai.Response{Chunks: words("ok")})
	defer srv.Close()
	h := openaiagent.HistoryFunc(func(context.Context, worker.Scope) ([]projection.Message, error) {
		return []projection.Message{
			{Role: "user", Parts: []projection.Part{{Type: "text", Text: "q1"}}},
			{Role: "assistant", Parts: []projection.Part{{Type: "reasoning", Text: "hidden"}, {Type: "text", Text: "a1"}, {Type: "tool", ToolCallID: "c1", ToolName: "t", State: "output-available", Input: json.RawMessage(`{"x":1}`), Output: json.RawMessage(`[1]`)}}},
			{Role: "assistant", Parts: []projection.Part{{Type: "tool", ToolCallID: "c2", ToolName: "t", State: "input-available", Input: json.RawMessage(`{}`)}}},
			{Role: "user", Parts: []projection.Part{{Type: "text", Text: "q2"}}},
		}, nil
	})
	collect(t, agent(srv, h))
	b, _ := json.Marshal(srv.Requests()[0].Messages())
	want := `[{"content":"q1","role":"user"},{"content":"a1","role":"assistant","tool_calls":[{"function":{"arguments":"{\"x\":1}","name":"t"},"id":"c1","type":"function"}]},{"content":"[1]","role":"tool","tool_call_id":"c1"},{"role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"t"},"id":"c2","type":"function"}]},{"content":"{\"error\":\"no result: the turn was cut short\"}","role":"tool","tool_call_id":"c2"},{"content":"q2","role":"user"}]`
	if string(b) != want {
		t.Fatalf("messages\n got %s\nwant %s", b, want)
	}
}

func TestFailures(t *testing.T) {
	t.Run("rate limited, then fine", func(t *testing.T) {
		srv := fakeopenai.New(fakeopenai.ErrRateLimited, fakeopenai.Response{Chunks: words("fine")})
		defer srv.Close()
		evs := collect(t, agent(srv, userHistory("x")))
		if evs[0].Type != worker.EventRetrying || evs[0].Attempt != 1 || evs[0].MaxAttempts != 3 || !strings.Contains(evs[0].Reason, "429") || evs[len(evs)-1].Type != worker.EventCompleted {
			t.Fatalf("%+v", evs)
		}
	})
	t.Run("rate limited to the end", func(t *testing.T) {
		srv := fakeopenai.New(fakeopenai.ErrRateLimited)
		defer srv.Close()
		evs := collect(t, agent(srv, userHistory("x")))
		last := evs[len(evs)-1]
		if len(evs) != 3 || last.Code != openaiagent.CodeRateLimited || !last.Retryable || !strings.Contains(last.Details, "Rate limit reached") {
			t.Fatalf("%+v", evs)
		}
	})
	t.Run("overloaded", func(t *testing.T) {
		srv := fakeopenai.New(fakeopenai.ErrOverloaded)
		defer srv.Close()
		last := collect(t, agent(srv, userHistory("x")))
		if l := last[len(last)-1]; l.Code != openaiagent.CodeUpstreamUnavailable || !l.Retryable {
			t.Fatalf("%+v", l)
		}
	})
	t.Run("retry-after honoured", func(t *testing.T) {
		r := fakeopenai.ErrRateLimited
		r.Headers = map[string]string{"Retry-After": "0.25"}
		srv := fakeopenai.New(r, fakeopenai.Response{Chunks: words("ok")})
		defer srv.Close()
		evs := collect(t, agent(srv, userHistory("x")))
		if evs[0].DelayMs != 250 {
			t.Fatalf("%+v", evs[0])
		}
	})
	for name, r := range map[string]fakeopenai.Response{"bad key": fakeopenai.ErrInvalidKey, "unknown model": fakeopenai.ErrUnknownModel} {
		t.Run(name, func(t *testing.T) {
			srv := fakeopenai.New(r)
			defer srv.Close()
			evs := collect(t, agent(srv, userHistory("x")))
			if len(evs) != 1 || evs[0].Code != openaiagent.CodeUpstreamRejected || evs[0].Retryable || !strings.Contains(evs[0].Details, r.Error.Message) {
				t.Fatalf("%+v", evs)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		srv := fakeopenai.New()
		srv.Close()
		evs := collect(t, agent(srv, userHistory("x")))
		if l := evs[len(evs)-1]; l.Code != openaiagent.CodeUpstreamUnavailable || !l.Retryable || evs[0].Type != worker.EventRetrying {
			t.Fatalf("%+v", evs)
		}
	})
	t.Run("cut mid-stream is not retried", func(t *testing.T) {
		srv := fakeopenai.New(fakeopenai.Response{Chunks: words("a b c d"), CutAfter: 2})
		defer srv.Close()
		evs := collect(t, agent(srv, userHistory("x")))
		if l := evs[len(evs)-1]; l.Code != openaiagent.CodeUpstreamUnavailable || !l.Retryable || len(srv.Requests()) != 1 {
			t.Fatalf("%+v", evs)
		}
	})
	t.Run("max steps", func(t *testing.T) {
		tool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) }))
		defer tool.Close()
		srv := fakeopenai.New(fakeopenai.Response{Chunks: []fakeopenai.Chunk{{ToolCalls: []fakeopenai.ToolCallDelta{{ID: "c", Name: "t", Arguments: "{}"}}}}})
		defer srv.Close()
		a := agent(srv, userHistory("x"))
		a.Tools = []openaiagent.Tool{{Name: "t", URL: tool.URL}}
		a.MaxSteps = 2
		evs := collect(t, a)
		if l := evs[len(evs)-1]; l.Code != openaiagent.CodeMaxSteps || len(srv.Requests()) != 2 {
			t.Fatalf("%+v", evs)
		}
	})
}

// Stopping mid-answer closes the upstream request at once: the fake,
// holding a stalled stream, sees its client go.
func TestStopClosesUpstream(t *testing.T) {
	for _, cancelCtx := range []bool{false, true} {
		srv := fakeopenai.New(fakeopenai.Response{Chunks: words("a b c d"), StallAfter: 2})
		a := agent(srv, userHistory("x"))
		if err := agenttest.CheckStop(a, worker.Scope{}, worker.Prompt{Text: "x"}, 2*time.Second, cancelCtx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-srv.Closed():
		case <-time.After(10 * time.Second):
			t.Fatal("upstream request still open")
		}
		srv.Close()
	}
}
