package openaiagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
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
	a.Tools = []openaiagent.Tool{{Name: "weather", Description: "current weather", Parameters: map[string]any{"type": "object"}, URL: tool.URL, AllowPrivate: true}}
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
		a.Tools = []openaiagent.Tool{{Name: "t", URL: tool.URL, AllowPrivate: true}}
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

// listen serves h on a free port of ip (the whole of 127.0.0.0/8 is
// loopback on Linux: 127.0.0.2 is another host for the URL rules).
func listen(t *testing.T, ip string, h http.Handler) *httptest.Server {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// What a tool answers, or fails to, becomes its result: a redirect to
// another host is not followed (its answer would be stored and shown to
// the model), a loopback tool is refused unless allowed, and an answer
// over 4 MiB is marked isError instead of being cut silently.
func TestToolResults(t *testing.T) {
	var elsewhere atomic.Int32
	other := listen(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		io.WriteString(w, `{"secret":"instance credentials"}`)
	}))
	tool := listen(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/latest/meta-data/", http.StatusFound)
		case "/moved":
			http.Redirect(w, r, "/ok", http.StatusTemporaryRedirect)
		case "/ok":
			io.WriteString(w, `{"tempC":21}`)
		case "/huge":
			w.Write(bytes.Repeat([]byte("x"), openaiagent.MaxToolAnswer+1))
		case "/full":
			w.Write(bytes.Repeat([]byte("x"), openaiagent.MaxToolAnswer))
		}
	}))
	for _, tc := range []struct {
		name         string
		url          string
		allowPrivate bool
		wantErr      bool
		want         string // a substring of the result
	}{
		{"cross-host redirect", tool.URL + "/away", true, true, "only same-origin redirects"},
		{"same-origin redirect", tool.URL + "/moved", true, false, `{"tempC":21}`},
		{"loopback refused by default", tool.URL + "/ok", false, true, "set allowPrivate: true on the tool"},
		{"metadata refused", "http://169.254.169.254/latest/meta-data/", true, true, "cloud metadata address"},
		{"answer over 4 MiB", tool.URL + "/huge", true, true, "over 4 MiB"},
		{"answer of 4 MiB", tool.URL + "/full", true, false, `"xxxx`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fakeopenai.New(
				fakeopenai.Response{Chunks: []fakeopenai.Chunk{{ToolCalls: []fakeopenai.ToolCallDelta{{ID: "c", Name: "t", Arguments: "{}"}}}}},
				fakeopenai.Response{Chunks: words("done")},
			)
			defer srv.Close()
			a := agent(srv, userHistory("x"))
			a.Tools = []openaiagent.Tool{{Name: "t", URL: tc.url, AllowPrivate: tc.allowPrivate}}
			var ended *worker.Event
			for _, ev := range collect(t, a) {
				if ev.Type == worker.EventToolEnded {
					ended = &ev
				}
			}
			if ended == nil || ended.IsError != tc.wantErr || !strings.Contains(string(ended.Content), tc.want) {
				t.Fatalf("%+v", ended)
			}
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the other host got %d requests", n)
	}
}

// A model endpoint the policy refuses fails the turn at once, not
// retryable: no retry changes an address.
func TestModelEndpointRefused(t *testing.T) {
	a := &openaiagent.Agent{BaseURL: "http://169.254.169.254/v1", Model: "m", Backoff: func(int) time.Duration { return time.Millisecond }}
	evs := collect(t, a)
	if l := evs[len(evs)-1]; l.Type != worker.EventFailed || l.Code != "egress_refused" || l.Retryable || len(evs) != 1 {
		t.Fatalf("%+v", evs)
	}
}
