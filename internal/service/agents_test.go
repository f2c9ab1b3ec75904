package service

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/internal/config"
	"github.com/convlog/convlog/internal/servicetest"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker/agenttest"
	"github.com/convlog/convlog/worker/openaiagent"
	"github.com/convlog/convlog/worker/openaiagent/fakeopenai"
)

// withConfig serves the agents of a convlog.yaml given inline.
func withConfig(t testing.TB, yaml string) func(*Config) {
	t.Helper()
	f, err := config.Parse("convlog.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return func(cfg *Config) { cfg.Agents = f }
}

func viewOf(t testing.TB, c *client.Client, agent, instance, session string, last wire.Accepted) projection.View {
	t.Helper()
	return projection.Project(servicetest.ReadUntilSettled(t, c, agent, instance, session, record.Start, last.SubmissionID))
}

func settlement(v projection.View, id string) record.Settlement {
	for _, s := range v.Settlements {
		if s.SubmissionID == id {
			return s
		}
	}
	return record.Settlement{}
}

// The openai kind over HTTP against a server speaking the real wire
// format: the model's tokens arrive as deltas, its tool call as
// toolcall_delta frames, the call and its result are stored as tool parts,
// and the turn settles; the next turn's request carries the history.
func TestOpenAIAgentEndToEnd(t *testing.T) {
	tool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var args struct{ City string }
		json.NewDecoder(r.Body).Decode(&args)
		fmt.Fprintf(w, `{"city":%q,"tempC":21}`, args.City)
	}))
	defer tool.Close()
	model := fakeopenai.New(
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{
			{Reasoning: "The user wants weather. "},
			{Content: "Checking "},
			{Content: "now. "},
			{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, ID: "call_w1", Name: "weather", Arguments: `{"city"`}}},
			{ToolCalls: []fakeopenai.ToolCallDelta{{Index: 0, Arguments: `:"Paris"}`}}},
		}},
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "It is "}, {Content: "21C in Paris."}}},
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "You're welcome."}}},
	)
	defer model.Close()
	t.Setenv("FAKE_OPENAI_KEY", "sk-e2e")
	_, c := testService(t, withConfig(t, fmt.Sprintf(`agents:
  - name: support
    kind: openai
    baseURL: %s
    model: gpt-4o-mini
    apiKeyEnv: FAKE_OPENAI_KEY
    system: "You are a helpful support agent."
    tools:
      - name: weather
        description: current weather of a city
        parameters: {type: object, properties: {city: {type: string}}, required: [city]}
        url: %s
        allowPrivate: true
`, model.BaseURL(), tool.URL)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sr, err := c.Stream(ctx, "support", "u1", "s", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Close()
	acc := servicetest.Deliver(t, c, "support", "u1", "s", "Weather in Paris?")
	frames := collectSSE(t, sr, acc.SubmissionID)
	var text, reasoning, argsDeltas strings.Builder
	var fullArgs string
	for _, f := range frames {
		var d struct {
			Type, Kind, Delta, ArgsDelta, ToolCallID string
			Args                                     json.RawMessage
		}
		json.Unmarshal(f.Raw, &d)
		switch f.Type {
		case "delta":
			if d.Kind == "reasoning" {
				reasoning.WriteString(d.Delta)
			} else {
				text.WriteString(d.Delta)
			}
		case "toolcall_delta":
			if d.ToolCallID != "call_w1" {
				t.Fatalf("toolcall_delta %s", f.Raw)
			}
			argsDeltas.WriteString(d.ArgsDelta)
			if d.Args != nil {
				fullArgs = string(d.Args)
			}
		}
	}
	// The reader stops at the settlement, and a delta may arrive after the
	// record that holds its text (docs/protocol.md 4.1): the live text is
	// the reply's start, in order.
	if text.Len() == 0 || !strings.HasPrefix("Checking now. It is 21C in Paris.", text.String()) || reasoning.String() != "The user wants weather. " {
		t.Fatalf("deltas: text %q reasoning %q", text.String(), reasoning.String())
	}
	if argsDeltas.String() != `{"city":"Paris"}` || fullArgs != `{"city":"Paris"}` {
		t.Fatalf("toolcall deltas %q, args %q", argsDeltas.String(), fullArgs)
	}
	v := viewOf(t, c, "support", "u1", "s", acc)
	if s := settlement(v, acc.SubmissionID); s.Outcome != record.OutcomeCompleted {
		t.Fatalf("settlement %+v", s)
	}
	var toolPart *projection.Part
	for _, m := range v.Messages {
		for i, p := range m.Parts {
			if p.Type == projection.PartTool {
				toolPart = &m.Parts[i]
			}
		}
	}
	if toolPart == nil || toolPart.ToolName != "weather" || string(toolPart.Input) != `{"city":"Paris"}` || toolPart.State != projection.StateOutputAvailable || string(toolPart.Output) != `{"city":"Paris","tempC":21}` {
		t.Fatalf("tool part %+v in %+v", toolPart, v.Messages)
	}
	// The next turn is built from the active path: system, the first
	// exchange with its tool call and result, then the new message.
	acc2 := servicetest.Deliver(t, c, "support", "u1", "s", "Thanks!")
	viewOf(t, c, "support", "u1", "s", acc2)
	reqs := model.Requests()
	if len(reqs) != 3 || reqs[0].Header.Get("Authorization") != "Bearer sk-e2e" {
		t.Fatalf("%d requests", len(reqs))
	}
	var roles []string
	for _, m := range reqs[2].Messages() {
		roles = append(roles, m["role"].(string))
	}
	if got := strings.Join(roles, " "); got != "system user assistant tool assistant user" {
		t.Fatalf("third request roles: %s", got)
	}
}

// Aborting mid-answer closes the upstream request at once: the fake, its
// stream stalled, notices its client go within 100 ms of the abort.
func TestOpenAIAbortClosesUpstream(t *testing.T) {
	model := fakeopenai.New(fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "partial "}, {Content: "answer "}, {Content: "never"}}, StallAfter: 2})
	defer model.Close()
	_, c := testService(t, withConfig(t, fmt.Sprintf("agents:\n  - name: m\n    kind: openai\n    baseURL: %s\n    model: x\n", model.BaseURL())))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sr, err := c.Stream(ctx, "m", "i", "s", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Close()
	acc := servicetest.Deliver(t, c, "m", "i", "s", "talk")
	select {
	case <-model.Started():
	case <-time.After(30 * time.Second):
		t.Fatal("the model was never called")
	}
	// The turn is mid-answer once the agent has taken both chunks: their
	// deltas reach readers only after that (the model's writing them is
	// not enough). Then abort.
	var seen strings.Builder
	for seen.String() != "partial answer " {
		f, err := sr.Next()
		if err != nil {
			t.Fatalf("stream: %v (deltas so far %q)", err, seen.String())
		}
		if f.Type == "delta" {
			var d struct{ Delta string }
			json.Unmarshal(f.Raw, &d)
			seen.WriteString(d.Delta)
		}
	}
	if s, err := c.Submission(context.Background(), "m", "i", acc.SubmissionID, 0); err != nil || s.Status != record.StatusRunning {
		t.Fatalf("%+v %v", s, err)
	}
	start := time.Now()
	sub, err := c.Abort(context.Background(), "m", "i", acc.SubmissionID)
	if err != nil {
		t.Fatal(err)
	}
	var closedAt time.Time
	select {
	case closedAt = <-model.Closed():
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not closed")
	}
	took := closedAt.Sub(start)
	t.Logf("upstream closed %v after the abort request", took)
	if took > 100*time.Millisecond {
		t.Errorf("upstream closed %v after the abort: want within 100ms", took)
	}
	if sub.Status != record.StatusAborted {
		t.Fatalf("%+v", sub)
	}
	v := viewOf(t, c, "m", "i", "s", acc)
	last := v.Messages[len(v.Messages)-1]
	if last.Role != "assistant" || last.Parts[0].Text != "partial answer " {
		t.Fatalf("the partial answer is not kept: %+v", v.Messages)
	}
}

// The Python agent of docs/agents.md, run for real as an http agent and as
// an exec agent.
func TestPythonAgentHTTPAndExec(t *testing.T) {
	url := agenttest.StartHTTPAgent(t)
	py, script := agenttest.Python(t), agenttest.ExampleAgent(t)
	_, c := testService(t, withConfig(t, fmt.Sprintf(`agents:
  - name: remote
    kind: http
    url: %s
  - name: script
    kind: exec
    command: [%q, %q]
    env: {LANG: C.UTF-8}
`, url, py, script)))
	for _, agent := range []string{"remote", "script"} {
		t.Run(agent, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			sr, err := c.Stream(ctx, agent, "i", "s", record.Start)
			if err != nil {
				t.Fatal(err)
			}
			defer sr.Close()
			acc := servicetest.Deliver(t, c, agent, "i", "s", "hello world")
			relayed := false
			for _, f := range collectSSE(t, sr, acc.SubmissionID) {
				var e struct {
					Event json.RawMessage
				}
				json.Unmarshal(f.Raw, &e)
				if f.Type == "event" && strings.ReplaceAll(string(e.Event), " ", "") == `{"type":"x-progress","pct":50}` {
					relayed = true
				}
			}
			if !relayed {
				t.Error("the unknown x-progress event did not reach the live reader")
			}
			v := viewOf(t, c, agent, "i", "s", acc)
			if s := settlement(v, acc.SubmissionID); s.Outcome != record.OutcomeCompleted {
				t.Fatalf("settlement %+v", s)
			}
			var texts []string
			var tool projection.Part
			for _, m := range v.Messages[1:] {
				for _, p := range m.Parts {
					switch p.Type {
					case "text", "reasoning":
						texts = append(texts, p.Type+":"+p.Text)
					case projection.PartTool:
						tool = p
					}
				}
			}
			if got := strings.Join(texts, "|"); got != "reasoning:2 words. |text:HELLO WORLD " {
				t.Fatalf("texts %q", got)
			}
			if tool.ToolName != "count" || strings.ReplaceAll(string(tool.Output), " ", "") != `{"words":2}` {
				t.Fatalf("tool %+v", tool)
			}
			fail := servicetest.Deliver(t, c, agent, "i", "s", "fail please")
			if s := settlement(viewOf(t, c, agent, "i", "s", fail), fail.SubmissionID); s.Outcome != record.OutcomeFailed || s.Error.Code != "asked_to_fail" {
				t.Fatalf("%+v", s)
			}
		})
	}
}

func TestGetAgents(t *testing.T) {
	_, c := testService(t, withConfig(t, `agents:
  - name: support
    kind: openai
    busy: interrupt
    baseURL: http://127.0.0.1:1/v1
    model: secret-model
    apiKeyEnv: SOME_KEY
  - name: remote
    kind: http
    busy: queue
    url: http://127.0.0.1:1/hidden?token=abc
    headers: {Authorization: Bearer xyz}
  - name: old
    kind: echo
    busy: enqueue
`))
	resp, err := http.Get(c.BaseURL + "/agents")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	want := `{"agents":[{"name":"old","kind":"echo","busy":"join"},{"name":"remote","kind":"http","busy":"queue"},{"name":"support","kind":"openai","busy":"interrupt"}]}`
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != want {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	// Without a config: echo, as before.
	_, plain := testService(t, nil)
	resp2, err := http.Get(plain.BaseURL + "/agents")
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	b, _ = io.ReadAll(resp2.Body)
	if strings.TrimSpace(string(b)) != `{"agents":[{"name":"echo","kind":"echo","busy":"join"}]}` {
		t.Fatalf("%s", b)
	}
}

// docs/agents.md shows the Python agent the tests run, unchanged.
func TestDocsShowTheTestedAgent(t *testing.T) {
	doc, err := os.ReadFile("../../docs/agents.md")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := os.ReadFile("../../docs/examples/agent.py")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```python\n"+string(agent)+"```") {
		t.Fatal("docs/agents.md does not show docs/examples/agent.py as it is")
	}
	if n := strings.Count(string(agent), "\n"); n > 40 {
		t.Fatalf("the example agent has grown to %d lines", n)
	}
}

// The openai kind sends the model only the active path: after a
// regenerate (a rewind, then the same message again) the rewound answer is
// not in the next request, and after a rewind to the start neither is the
// question it answered.
func TestOpenAIPromptFollowsTheActivePath(t *testing.T) {
	model := fakeopenai.New(
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "the rewound answer"}}},
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "the regenerated answer"}}},
		fakeopenai.Response{Chunks: []fakeopenai.Chunk{{Content: "a fresh start"}}},
	)
	defer model.Close()
	t.Setenv("FAKE_OPENAI_KEY", "sk-e2e")
	svc, _ := testService(t, withConfig(t, fmt.Sprintf(`agents:
  - name: support
    kind: openai
    baseURL: %s
    model: gpt-4o-mini
    apiKeyEnv: FAKE_OPENAI_KEY
`, model.BaseURL())))
	r := raw{t, "http://" + svc.Addr()}
	settle := func(id string) {
		t.Helper()
		check.For(t, time.Minute, 10*time.Millisecond, func() error {
			var s record.Submission
			r.must(200, "GET", "/agents/support/u1/submissions/"+id+"?wait=5s", "", &s)
			if s.Status.Terminal() && s.Status != record.StatusCompleted {
				t.Fatalf("submission %+v", s)
			}
			if s.Status != record.StatusCompleted {
				return fmt.Errorf("submission %+v", s)
			}
			return nil
		})
	}
	var acc accepted
	r.must(202, "POST", "/agents/support/u1", `{"message":"the first question"}`, &acc)
	settle(acc.SubmissionID)
	r.must(202, "POST", "/agents/support/u1/regenerate", `{}`, &acc)
	settle(acc.SubmissionID)
	contents := func(i int) string {
		reqs := model.Requests()
		if len(reqs) <= i {
			t.Fatalf("%d model requests, want more than %d", len(reqs), i)
		}
		var b strings.Builder
		for _, m := range reqs[i].Messages() {
			fmt.Fprintf(&b, "%s: %v\n", m["role"], m["content"])
		}
		return b.String()
	}
	if got := contents(1); strings.Contains(got, "the rewound answer") || strings.Count(got, "the first question") != 1 {
		t.Fatalf("the regenerated turn's request:\n%s", got)
	}
	// Rewind to before the first question: the next turn starts afresh.
	var cps struct {
		Checkpoints []struct {
			EntryID string `json:"entryId"`
		} `json:"checkpoints"`
	}
	r.must(200, "GET", "/agents/support/u1/checkpoints", "", &cps)
	if len(cps.Checkpoints) != 1 {
		t.Fatalf("checkpoints %+v", cps)
	}
	r.must(200, "POST", "/agents/support/u1/rewind", `{"entryId":"`+cps.Checkpoints[0].EntryID+`"}`, nil)
	r.must(202, "POST", "/agents/support/u1", `{"message":"something else"}`, &acc)
	settle(acc.SubmissionID)
	if got := contents(2); strings.Contains(got, "first question") || strings.Contains(got, "answer") || !strings.Contains(got, "something else") {
		t.Fatalf("the request after a rewind to the start:\n%s", got)
	}
}

// A config tool's approval reaches the openai agent's tool.
func TestOpenAIToolApprovalMapped(t *testing.T) {
	f, err := config.Parse("convlog.yaml", []byte("agents:\n  - name: a\n    kind: openai\n    model: m\n    tools:\n      - {name: refund, url: \"http://x/\", approval: required}\n      - {name: lookup, url: \"http://x/\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ag, err := buildAgent(f.Agents[0], nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	tools := ag.(*openaiagent.Agent).Tools
	if tools[0].Approval != openaiagent.ApprovalRequired || tools[1].Approval != "" {
		t.Fatalf("%+v", tools)
	}
}
