package transport_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// liveBody reads a streaming response in the background, so that a test
// can wait for what the client has received so far.
type liveBody struct {
	resp *http.Response
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
	err  error
}

func openLive(t testing.TB, e *env, method, path, body string, header map[string]string) *liveBody {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), method, e.ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	lb := &liveBody{resp: resp, done: make(chan struct{})}
	go func() {
		defer close(lb.done)
		b := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(b)
			lb.mu.Lock()
			lb.buf.Write(b[:n])
			lb.mu.Unlock()
			if err != nil {
				if err != io.EOF {
					lb.err = err
				}
				return
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close(); <-lb.done })
	return lb
}

func (lb *liveBody) text() string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.buf.String()
}

// waitFor polls what was received until it contains s.
func (lb *liveBody) waitFor(t testing.TB, s string) {
	t.Helper()
	check.For(t, 10*time.Second, 2*time.Millisecond, func() error {
		if strings.Contains(lb.text(), s) {
			return nil
		}
		select {
		case <-lb.done:
			// All it received is in: look once more, then no wait helps.
			if !strings.Contains(lb.text(), s) {
				t.Fatalf("the stream ended without %q:\n%s", s, lb.text())
			}
			return nil
		default:
		}
		return fmt.Errorf("never received %q; got:\n%s", s, lb.text())
	})
}

// end waits for the body to end and returns it.
func (lb *liveBody) end(t testing.TB) string {
	t.Helper()
	select {
	case <-lb.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stream did not end; got:\n%s", lb.text())
	}
	if lb.err != nil {
		t.Fatalf("reading the stream: %v", lb.err)
	}
	return lb.text()
}

// fakeTurn plays the worker's part for one submission: it starts it, publishes
// frames and writes records exactly as worker/turn.go does.
type fakeTurn struct {
	t   testing.TB
	e   *env
	key record.Key
	sub string
	id  string
}

// awaitSubmission polls until key has an unsettled submission and starts a
// turn for it.
func awaitTurn(t testing.TB, e *env, key record.Key, turnID string) *fakeTurn {
	t.Helper()
	var sub string
	check.For(t, 10*time.Second, 2*time.Millisecond, func() error {
		p, err := e.db.Pending(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) == 0 {
			return fmt.Errorf("no submission for %s", key)
		}
		sub = p[len(p)-1].ID
		return nil
	})
	ft := &fakeTurn{t: t, e: e, key: key, sub: sub, id: turnID}
	if _, err := e.db.Write(context.Background(), log.Write{Key: key, Start: []string{ft.sub}, TurnID: turnID}); err != nil {
		t.Fatal(err)
	}
	return ft
}

func (ft *fakeTurn) frame(f map[string]any) {
	f["turnId"], f["submissionId"] = ft.id, ft.sub
	b, _ := json.Marshal(f)
	ft.e.hub.publish(ft.key, string(b))
}

func (ft *fakeTurn) delta(kind, d string) {
	ft.frame(map[string]any{"type": "delta", "kind": kind, "delta": d})
}

func (ft *fakeTurn) toolFrame(id, name string, args string) {
	ft.frame(map[string]any{"type": "toolcall_delta", "toolCallId": id, "toolName": name, "args": json.RawMessage(args)})
}

func (ft *fakeTurn) entry(typ string, payload any) record.Record {
	p, _ := json.Marshal(payload)
	return record.EntryRecord(record.Entry{Type: typ, Payload: p, SubmissionID: ft.sub, TurnID: ft.id})
}

func (ft *fakeTurn) write(recs []record.Record, settle ...record.Settlement) {
	ft.t.Helper()
	if _, err := ft.e.db.Write(context.Background(), log.Write{Key: ft.key, Records: recs, TurnID: ft.id, Settle: settle}); err != nil {
		ft.t.Fatal(err)
	}
}

func (ft *fakeTurn) message(parts ...record.Part) record.Record {
	return ft.entry(record.EntryAssistantMessage, record.MessagePayload{Parts: parts})
}

// script runs a turn with every kind of record and frame: reasoning, text,
// a tool call and its result, text after it, and a final record that holds
// more than its deltas did (a lost frame), then the settlement. wait(s)
// waits until the client received the output of the step, so that the bytes
// do not depend on timing.
func (ft *fakeTurn) script(wait func(step string), outcome record.Outcome) {
	ft.delta("reasoning", "Let me think.")
	wait("reasoning")
	ft.delta("text", "Hel")
	wait("Hel")
	ft.delta("text", "lo")
	wait("lo")
	ft.toolFrame("call_1", "lookup", `{"q":"x"}`)
	ft.write([]record.Record{ft.message(
		record.Part{Type: record.PartReasoning, Text: "Let me think."},
		record.Part{Type: record.PartText, Text: "Hello"},
		record.Part{Type: record.PartToolCall, ToolCallID: "call_1", ToolName: "lookup", Input: json.RawMessage(`{"q":"x"}`)},
	)})
	wait("call_1")
	ft.write([]record.Record{ft.entry(record.EntryToolResult, record.ToolResultPayload{ToolCallID: "call_1", ToolName: "lookup", Output: json.RawMessage(`{"answer":42}`)})})
	wait("42")
	ft.delta("text", ", world")
	wait(", world")
	st := record.Settlement{SubmissionID: ft.sub, Outcome: outcome}
	last := record.Part{Type: record.PartText, Text: ", world!"}
	if outcome == record.OutcomeFailed {
		st.Error = &record.Failure{Code: "agent_failed", Message: "the model went away", Retryable: true}
		last.Text = ", world"
	}
	ft.write([]record.Record{ft.message(last)}, st)
}

func aiSDKBody(chatID, msgID, text string) string {
	b, _ := json.Marshal(map[string]any{
		"id": chatID, "trigger": "submit-message", "messageId": nil,
		"messages": []any{map[string]any{"id": msgID, "role": "user", "parts": []any{map[string]any{"type": "text", "text": text}}}},
	})
	return string(b)
}

func TestAISDKStreamGolden(t *testing.T) {
	for _, outcome := range []record.Outcome{record.OutcomeCompleted, record.OutcomeFailed} {
		t.Run(string(outcome), func(t *testing.T) {
			e := newEnv(t)
			lb := openLive(t, e, http.MethodPost, "/ai-sdk/echo", aiSDKBody("chat1", "m1", "hi"), nil)
			if lb.resp.StatusCode != http.StatusOK || lb.resp.Header.Get("x-vercel-ai-ui-message-stream") != "v1" ||
				lb.resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%d %v", lb.resp.StatusCode, lb.resp.Header)
			}
			ft := awaitTurn(t, e, record.Key{Agent: "echo", Instance: "chat1", Session: "default"}, "turn_1")
			ft.script(func(step string) {
				if step == "reasoning" {
					step = "Let me think."
				}
				lb.waitFor(t, step)
			}, outcome)
			got := lb.end(t)
			if !strings.HasSuffix(got, "data: [DONE]\n\n") {
				t.Fatalf("no [DONE]: %s", got)
			}
			golden(t, "aisdk_"+string(outcome)+".txt", []byte(got))
		})
	}
}

// chunks decodes a UI message stream's data lines.
func chunks(t testing.TB, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// answerText concatenates the text deltas of a UI message stream.
func answerText(t testing.TB, body string) string {
	var b strings.Builder
	for _, c := range chunks(t, body) {
		if c["type"] == "text-delta" {
			b.WriteString(c["delta"].(string))
		}
	}
	return b.String()
}

// A resume in the middle of an answer replays it from its start: what is
// recorded, then what was not yet when it connected comes whole with its
// record. The answer arrives exactly once. A resume when nothing runs is 204.
func TestAISDKResume(t *testing.T) {
	e := newEnv(t)
	status, _, _ := e.do(t, http.MethodGet, "/ai-sdk/echo/chat2/stream", nil, nil)
	if status != http.StatusNoContent {
		t.Fatalf("idle resume: %d", status)
	}
	first := openLive(t, e, http.MethodPost, "/ai-sdk/echo", aiSDKBody("chat2", "m1", "hi"), nil)
	ft := awaitTurn(t, e, record.Key{Agent: "echo", Instance: "chat2", Session: "default"}, "turn_r")
	ft.delta("text", "Hel")
	first.waitFor(t, "Hel")
	first.resp.Body.Close() // the client is cut off mid-answer

	resumed := openLive(t, e, http.MethodGet, "/ai-sdk/echo/chat2/stream", "", nil)
	if resumed.resp.StatusCode != http.StatusOK {
		t.Fatalf("resume: %d", resumed.resp.StatusCode)
	}
	resumed.waitFor(t, `"type":"start-step"`)
	ft.delta("text", "lo")
	ft.toolFrame("call_9", "clock", `{}`)
	ft.write([]record.Record{ft.message(
		record.Part{Type: record.PartText, Text: "Hello"},
		record.Part{Type: record.PartToolCall, ToolCallID: "call_9", ToolName: "clock", Input: json.RawMessage(`{}`)},
	)})
	resumed.waitFor(t, "call_9")
	// After a tool call the resumed reader follows the next segment live.
	ft.delta("text", " again")
	resumed.waitFor(t, " again")
	ft.write([]record.Record{ft.message(record.Part{Type: record.PartText, Text: " again"})}, record.Settlement{SubmissionID: ft.sub, Outcome: record.OutcomeCompleted})
	body := resumed.end(t)
	if got := answerText(t, body); got != "Hello again" {
		t.Fatalf("resumed answer %q:\n%s", got, body)
	}
	if !strings.Contains(body, `"messageId":"`+ft.sub+`"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("resumed stream: %s", body)
	}
	status, _, _ = e.do(t, http.MethodGet, "/ai-sdk/echo/chat2/stream", nil, nil)
	if status != http.StatusNoContent {
		t.Fatalf("resume after the end: %d", status)
	}
	// A retried send (same UI message id) runs nothing new: it replays the
	// first answer from the log.
	replay := openLive(t, e, http.MethodPost, "/ai-sdk/echo", aiSDKBody("chat2", "m1", "hi"), nil)
	if got := answerText(t, replay.end(t)); got != "Hello again" {
		t.Fatalf("replayed answer %q", got)
	}
	if p, _ := e.db.Pending(context.Background(), ft.key); len(p) != 0 {
		t.Fatalf("the retry was admitted again: %+v", p)
	}
}

func TestAISDKErrors(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		body string
		code string
		want string
	}{
		{`{"id":"c","messages":[]}`, "bad_request", "empty"},
		{`{"id":"c","messages":[{"id":"m","role":"assistant","parts":[{"type":"text","text":"x"}]}]}`, "bad_request", "user"},
		{`{"id":"a b","messages":[{"id":"m","role":"user","parts":[{"type":"text","text":"x"}]}]}`, "invalid_name", "chat id"},
		{`{"messages":[{"id":"m","role":"user","parts":[{"type":"text","text":"x"}]}]}`, "bad_request", "id"},
		{`[`, "bad_request", "JSON"},
	}
	for _, c := range cases {
		status, _, body := e.postJSON(t, "/ai-sdk/echo", c.body, nil)
		got := errorOf(t, body)
		if status != http.StatusBadRequest || got["code"] != c.code || !strings.Contains(got["message"].(string), c.want) {
			t.Errorf("%s: %d %v", c.body, status, got)
		}
	}
	status, _, body := e.postJSON(t, "/ai-sdk/nobody", aiSDKBody("c", "m", "x"), nil)
	if status != http.StatusNotFound || errorOf(t, body)["code"] != "not_found" {
		t.Errorf("unknown agent: %d %s", status, body)
	}
}

func TestAGUIStreamGolden(t *testing.T) {
	for _, outcome := range []record.Outcome{record.OutcomeCompleted, record.OutcomeFailed} {
		t.Run(string(outcome), func(t *testing.T) {
			e := newEnv(t)
			in := `{"threadId":"thread1","runId":"run1","state":{},"tools":[],"context":[],"forwardedProps":{},
				"messages":[{"id":"u1","role":"user","content":"hi"}]}`
			lb := openLive(t, e, http.MethodPost, "/ag-ui/echo", in, map[string]string{"Accept": "text/event-stream"})
			if lb.resp.StatusCode != http.StatusOK {
				t.Fatalf("%d", lb.resp.StatusCode)
			}
			ft := awaitTurn(t, e, record.Key{Agent: "echo", Instance: "thread1", Session: "default"}, "turn_1")
			ft.script(func(step string) {
				if step == "reasoning" {
					step = "Let me think."
				}
				lb.waitFor(t, step)
			}, outcome)
			golden(t, "agui_"+string(outcome)+".txt", []byte(lb.end(t)))
		})
	}
}

func a2aCall(t testing.TB, e *env, method string, params any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
	status, h, body := e.postJSON(t, "/a2a/echo", string(b), map[string]string{"A2A-Version": "1.0"})
	if status != http.StatusOK || h.Get("A2A-Version") != "1.0" {
		t.Fatalf("%s: %d %v %s", method, status, h, body)
	}
	var resp map[string]any
	if err := json.Unmarshal(body, &resp); err != nil || resp["jsonrpc"] != "2.0" || resp["id"] != float64(7) {
		t.Fatalf("%s: %v %s", method, err, body)
	}
	return resp
}

func a2aMessage(contextID, msgID, text string) map[string]any {
	m := map[string]any{"messageId": msgID, "role": "ROLE_USER", "parts": []any{map[string]any{"text": text}}}
	if contextID != "" {
		m["contextId"] = contextID
	}
	return m
}

func TestA2AStreamGolden(t *testing.T) {
	for _, outcome := range []record.Outcome{record.OutcomeCompleted, record.OutcomeFailed} {
		t.Run(string(outcome), func(t *testing.T) {
			e := newEnv(t)
			b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "s1", "method": "SendStreamingMessage",
				"params": map[string]any{"message": a2aMessage("ctx1", "m1", "hi")}})
			lb := openLive(t, e, http.MethodPost, "/a2a/echo", string(b), map[string]string{"Accept": "text/event-stream"})
			if lb.resp.StatusCode != http.StatusOK || lb.resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%d %v", lb.resp.StatusCode, lb.resp.Header)
			}
			ft := awaitTurn(t, e, record.Key{Agent: "echo", Instance: "ctx1", Session: "default"}, "turn_1")
			lb.waitFor(t, `"task"`)
			ft.script(func(step string) {
				switch step {
				case "reasoning", "call_1", "42":
					return // not part of the text artifact
				}
				lb.waitFor(t, step)
			}, outcome)
			golden(t, "a2a_stream_"+string(outcome)+".txt", []byte(lb.end(t)))
		})
	}
}

// A2A over JSON-RPC: blocking and immediate sends, get, list, cancel,
// subscribe (a replay from the log), and the refusals.
func TestA2AMethods(t *testing.T) {
	aborted := make(chan string, 1)
	var e *env
	e = newEnv(t, func(o *envConfig) {
		o.A2ADefaultAgent = "echo"
		o.Abort = func(ctx context.Context, id string) (record.Submission, error) {
			sub, err := e.db.Submission(ctx, id)
			if err != nil {
				return sub, err
			}
			if sub.Status.Terminal() {
				return sub, log.ErrSubmissionSettled
			}
			_, err = e.db.Write(ctx, log.Write{Key: sub.Key, Settle: []record.Settlement{{SubmissionID: id, Outcome: record.OutcomeAborted,
				Error: &record.Failure{Code: "aborted", Message: "aborted before it ran"}}}})
			aborted <- id
			return sub, err
		}
	})
	for _, path := range []string{"/a2a/echo/.well-known/agent-card.json", "/.well-known/agent-card.json"} {
		status, _, body := e.do(t, http.MethodGet, path, nil, nil)
		var card map[string]any
		if status != http.StatusOK || json.Unmarshal(body, &card) != nil {
			t.Fatalf("%s: %d %s", path, status, body)
		}
		if card["url"] != e.ts.URL+"/a2a/echo" {
			t.Fatalf("card url %v", card["url"])
		}
		golden(t, "a2a_card.json", bytes.ReplaceAll(body, []byte(e.ts.URL), []byte("http://HOST")))
	}

	// Blocking send: answered by a fake turn.
	done := make(chan map[string]any, 1)
	go func() {
		done <- a2aCall(t, e, "SendMessage", map[string]any{"message": a2aMessage("ctx2", "m1", "hi")})
	}()
	key := record.Key{Agent: "echo", Instance: "ctx2", Session: "default"}
	ft := awaitTurn(t, e, key, "turn_a")
	ft.write([]record.Record{ft.message(record.Part{Type: record.PartText, Text: "hello there"})}, record.Settlement{SubmissionID: ft.sub, Outcome: record.OutcomeCompleted})
	resp := <-done
	task := resp["result"].(map[string]any)["task"].(map[string]any)
	if task["id"] != ft.sub || task["contextId"] != "ctx2" || task["status"].(map[string]any)["state"] != "TASK_STATE_COMPLETED" {
		t.Fatalf("task %v", task)
	}
	art := task["artifacts"].([]any)[0].(map[string]any)
	if art["artifactId"] != "output" || art["parts"].([]any)[0].(map[string]any)["text"] != "hello there" {
		t.Fatalf("artifact %v", art)
	}

	// GetTask reads the same from the log.
	got := a2aCall(t, e, "GetTask", map[string]any{"id": ft.sub})["result"].(map[string]any)
	if got["status"].(map[string]any)["state"] != "TASK_STATE_COMPLETED" || got["artifacts"] == nil {
		t.Fatalf("GetTask %v", got)
	}
	// SubscribeToTask on an ended task replays it whole.
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "SubscribeToTask", "params": map[string]any{"id": ft.sub}})
	sub := openLive(t, e, http.MethodPost, "/a2a/echo", string(b), nil)
	replayed := sub.end(t)
	if !strings.Contains(replayed, `"text":"hello there"`) || !strings.Contains(replayed, "TASK_STATE_COMPLETED") || strings.Count(replayed, "hello there") != 1 {
		t.Fatalf("subscribe replay: %s", replayed)
	}

	// Immediate send, then cancel before it runs.
	resp = a2aCall(t, e, "SendMessage", map[string]any{"message": a2aMessage("ctx2", "m2", "again"), "configuration": map[string]any{"returnImmediately": true}})
	task = resp["result"].(map[string]any)["task"].(map[string]any)
	if task["status"].(map[string]any)["state"] != "TASK_STATE_SUBMITTED" {
		t.Fatalf("immediate %v", task)
	}
	canceled := a2aCall(t, e, "CancelTask", map[string]any{"id": task["id"]})["result"].(map[string]any)
	if canceled["status"].(map[string]any)["state"] != "TASK_STATE_CANCELED" || <-aborted != task["id"] {
		t.Fatalf("cancel %v", canceled)
	}
	if e := a2aCall(t, e, "CancelTask", map[string]any{"id": task["id"]})["error"].(map[string]any); e["code"] != float64(-32002) {
		t.Fatalf("cancel twice %v", e)
	}
	list := a2aCall(t, e, "ListTasks", map[string]any{"contextId": "ctx2"})["result"].(map[string]any)
	tasks := list["tasks"].([]any)
	if len(tasks) != 2 || tasks[0].(map[string]any)["id"] != task["id"] || tasks[1].(map[string]any)["id"] != ft.sub {
		t.Fatalf("list %v", list)
	}

	// A retried message (same messageId) is the same task.
	again := a2aCall(t, e, "SendMessage", map[string]any{"message": a2aMessage("ctx2", "m2", "again"), "configuration": map[string]any{"returnImmediately": true}})
	if again["result"].(map[string]any)["task"].(map[string]any)["id"] != task["id"] {
		t.Fatalf("retry made a new task: %v", again)
	}

	for _, c := range []struct {
		method string
		params any
		code   float64
	}{
		{"GetTask", map[string]any{"id": "sub_nope"}, -32001},
		{"CreateTaskPushNotificationConfig", map[string]any{}, -32003},
		{"Nope", map[string]any{}, -32601},
		{"SendMessage", map[string]any{}, -32602},
		{"SendMessage", map[string]any{"message": map[string]any{"messageId": "x", "taskId": "t", "role": "ROLE_USER", "parts": []any{map[string]any{"text": "x"}}}}, -32004},
		{"ListTasks", map[string]any{}, -32602},
	} {
		r := a2aCall(t, e, c.method, c.params)
		if errObj, _ := r["error"].(map[string]any); errObj == nil || errObj["code"] != c.code {
			t.Errorf("%s: %v", c.method, r)
		}
	}
	// Version negotiation: a 0.3 client is told what this server speaks.
	status, _, body := e.postJSON(t, "/a2a/echo", `{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}`, map[string]string{"A2A-Version": "0.3"})
	if status != http.StatusOK || !strings.Contains(string(body), "-32009") {
		t.Fatalf("version: %d %s", status, body)
	}
	// A context id is generated when the message has none.
	resp = a2aCall(t, e, "SendMessage", map[string]any{"message": a2aMessage("", "m3", "x"), "configuration": map[string]any{"returnImmediately": true}})
	if ctxID, _ := resp["result"].(map[string]any)["task"].(map[string]any)["contextId"].(string); !strings.HasPrefix(ctxID, "ctx_") {
		t.Fatalf("generated context: %v", resp)
	}
}

// The adapters' routes answer CORS preflights.
func TestAdapterCORS(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.CORSOrigins = []string{"https://chat.example"} })
	for _, path := range []string{"/ai-sdk/echo", "/ai-sdk/echo/c1/stream", "/ag-ui/echo", "/a2a/echo", "/a2a/echo/.well-known/agent-card.json"} {
		status, h, _ := e.do(t, http.MethodOptions, path, nil, map[string]string{
			"Origin": "https://chat.example", "Access-Control-Request-Method": "POST",
			"Access-Control-Request-Headers": "content-type,a2a-version",
		})
		if status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://chat.example" ||
			!strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), "a2a-version") {
			t.Errorf("%s preflight: %d %v", path, status, h)
		}
	}
	status, h, _ := e.do(t, http.MethodGet, "/ai-sdk/echo/c1/stream", nil, map[string]string{"Origin": "https://chat.example"})
	if status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://chat.example" {
		t.Errorf("resume: %d %v", status, h)
	}
}

func TestStreamNDJSON(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.Heartbeat = 20 * time.Millisecond })
	key := record.Key{Agent: "echo", Instance: "nd", Session: "default"}
	if _, err := e.db.Append(context.Background(), key, userText("one")); err != nil {
		t.Fatal(err)
	}
	lb := openLive(t, e, http.MethodGet, "/agents/echo/nd/stream", "", map[string]string{"Accept": "application/x-ndjson"})
	if lb.resp.StatusCode != http.StatusOK || lb.resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %v", lb.resp.StatusCode, lb.resp.Header)
	}
	lb.waitFor(t, `"one"`)
	e.hub.publish(key, `{"type":"delta","kind":"text","delta":"x"}`)
	lb.waitFor(t, `"delta":"x"`)
	lb.waitFor(t, `{"type":"keepalive"}`)
	lb.resp.Body.Close()
	for _, line := range strings.Split(strings.TrimSuffix(lb.text(), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["type"] == nil {
			t.Fatalf("line %q is not a frame: %v", line, err)
		}
	}
	first := strings.SplitN(lb.text(), "\n", 2)[0]
	golden(t, "ndjson_conversation_frame.txt", []byte(first+"\n"))

	status, _, body := e.do(t, http.MethodGet, "/agents/echo/nd/stream", nil, map[string]string{"Accept": "text/html"})
	if status != http.StatusNotAcceptable || !strings.Contains(errorOf(t, body)["message"].(string), "application/x-ndjson") {
		t.Fatalf("406: %d %s", status, body)
	}
	for accept, want := range map[string]string{
		"":    "text/event-stream",
		"*/*": "text/event-stream",
		"application/x-ndjson;q=0.9, text/event-stream;q=0.5": "application/x-ndjson",
		"text/html, application/*;q=0.1":                      "application/x-ndjson",
	} {
		req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, e.ts.URL+"/agents/echo/nd/stream", nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("Content-Type") != want {
			t.Errorf("Accept %q: %s", accept, resp.Header.Get("Content-Type"))
		}
	}
}

func TestConversationLongPoll(t *testing.T) {
	e := newEnv(t)
	key := record.Key{Agent: "echo", Instance: "lp", Session: "default"}
	// Nothing comes: the timeout answers 200, up to date, no batches.
	status, _, body := e.do(t, http.MethodGet, "/agents/echo/lp/conversation?live=long-poll&timeout=10ms", nil, nil)
	var page struct {
		Batches    []json.RawMessage `json:"batches"`
		NextOffset string            `json:"nextOffset"`
		UpToDate   bool              `json:"upToDate"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &page) != nil || len(page.Batches) != 0 || !page.UpToDate {
		t.Fatalf("timeout: %d %s", status, body)
	}
	// A poll waiting at the tail returns when a record lands.
	type result struct {
		status int
		body   []byte
	}
	res := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, e.ts.URL+"/agents/echo/lp/conversation?live=long-poll&timeout=60s&offset="+page.NextOffset, nil)
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			res <- result{}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		res <- result{resp.StatusCode, b}
	}()
	// Wait until the poll is parked in the handler, then append.
	check.For(t, 30*time.Second, time.Millisecond, func() error {
		if e.active.Load() != 0 {
			return nil
		}
		return fmt.Errorf("the long poll is not in the handler")
	})
	if _, err := e.db.Append(context.Background(), key, userText("late")); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"late"`) {
		t.Fatalf("poll: %d %s", r.status, r.body)
	}
	for _, q := range []string{"live=sse", "live=long-poll&timeout=2m", "timeout=1s"} {
		status, _, body := e.do(t, http.MethodGet, "/agents/echo/lp/conversation?"+q, nil, nil)
		if status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", q, status, body)
		}
	}
}

// Deltas can arrive after the record that supersedes them (NATS and the log
// are separate paths): the stale ones are dropped, and the tool call's frame
// still tells the reader that the next deltas are the next segment's.
func TestAISDKLateDeltas(t *testing.T) {
	e := newEnv(t)
	lb := openLive(t, e, http.MethodPost, "/ai-sdk/echo", aiSDKBody("late", "m1", "hi"), nil)
	ft := awaitTurn(t, e, record.Key{Agent: "echo", Instance: "late", Session: "default"}, "turn_l")
	ft.write([]record.Record{ft.message(
		record.Part{Type: record.PartText, Text: "abc"},
		record.Part{Type: record.PartToolCall, ToolCallID: "call_x", ToolName: "t", Input: json.RawMessage(`{}`)},
	)})
	lb.waitFor(t, "tool-input-available")
	ft.delta("text", "ab") // late: already in the record
	ft.delta("text", "c")
	ft.toolFrame("call_x", "t", `{}`)
	ft.delta("text", "de")
	lb.waitFor(t, `"delta":"de"`)
	ft.write([]record.Record{ft.message(record.Part{Type: record.PartText, Text: "def"})}, record.Settlement{SubmissionID: ft.sub, Outcome: record.OutcomeCompleted})
	body := lb.end(t)
	if got := answerText(t, body); got != "abcdef" {
		t.Fatalf("answer %q:\n%s", got, body)
	}
}

// Frames of another turn of the same conversation (one queued ahead) are not
// this submission's answer.
func TestAISDKOtherTurnIgnored(t *testing.T) {
	e := newEnv(t)
	key := record.Key{Agent: "echo", Instance: "two", Session: "default"}
	first, _, err := e.db.Admit(context.Background(), log.Admission{Key: key, Records: []record.Record{userText("first")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Write(context.Background(), log.Write{Key: key, Start: []string{first.ID}, TurnID: "turn_first"}); err != nil {
		t.Fatal(err)
	}
	lb := openLive(t, e, http.MethodPost, "/ai-sdk/echo", aiSDKBody("two", "m2", "second"), nil)
	lb.waitFor(t, `"type":"start-step"`)
	other := &fakeTurn{t: t, e: e, key: key, sub: first.ID, id: "turn_first"}
	other.delta("text", "not mine")
	other.write([]record.Record{other.message(record.Part{Type: record.PartText, Text: "not mine"})}, record.Settlement{SubmissionID: first.ID, Outcome: record.OutcomeCompleted})
	ft := awaitTurn(t, e, key, "turn_second")
	ft.delta("text", "mine")
	lb.waitFor(t, `"delta":"mine"`)
	ft.write([]record.Record{ft.message(record.Part{Type: record.PartText, Text: "mine"})}, record.Settlement{SubmissionID: ft.sub, Outcome: record.OutcomeCompleted})
	if got := answerText(t, lb.end(t)); got != "mine" {
		t.Fatalf("answer %q", got)
	}
}

// regenerate-message rewinds the chat to before its last user message,
// delivers it again and streams the new answer.
func TestAISDKRegenerate(t *testing.T) {
	e := newEnv(t)
	key := record.Key{Agent: "echo", Instance: "regen", Session: "default"}
	first := openLive(t, e, http.MethodPost, "/ai-sdk/echo", aiSDKBody("regen", "m1", "hi"), nil)
	ft := awaitTurn(t, e, key, "turn_1")
	ft.write([]record.Record{ft.message(record.Part{Type: record.PartText, Text: "first answer"})}, record.Settlement{SubmissionID: ft.sub, Outcome: record.OutcomeCompleted})
	if got := answerText(t, first.end(t)); got != "first answer" {
		t.Fatalf("first %q", got)
	}
	body := `{"id":"regen","trigger":"regenerate-message","messageId":"` + ft.sub + `","messages":[{"id":"m1","role":"user","parts":[{"type":"text","text":"hi"}]}]}`
	again := openLive(t, e, http.MethodPost, "/ai-sdk/echo", body, nil)
	if again.resp.StatusCode != http.StatusOK {
		t.Fatalf("regenerate: %d %s", again.resp.StatusCode, again.end(t))
	}
	second := awaitTurn(t, e, key, "turn_2")
	if second.sub == ft.sub {
		t.Fatal("no new submission")
	}
	second.write([]record.Record{second.message(record.Part{Type: record.PartText, Text: "second answer"})}, record.Settlement{SubmissionID: second.sub, Outcome: record.OutcomeCompleted})
	if got := answerText(t, again.end(t)); got != "second answer" {
		t.Fatalf("regenerated %q", got)
	}
	_, _, page := e.do(t, http.MethodGet, "/agents/echo/regen/conversation", nil, nil)
	if !strings.Contains(string(page), `"kind":"truncated"`) {
		t.Fatalf("no rewind in the log: %s", page)
	}
}

// The adapters' input refusals and idempotency, each once wrong: an AG-UI
// retry with a new run id was 422 idempotency_key_reused, a binary part
// that is not base64 was stored, A2A took an agent's message as the
// user's, a JSON-RPC batch was a parse error and a notification was
// answered.
func TestAdapterInputs(t *testing.T) {
	e := newEnv(t)
	agui := func(runID, content string) string {
		return `{"threadId":"t1","runId":"` + runID + `","messages":[{"id":"m1","role":"user","content":` + content + `}]}`
	}
	t.Run("ag-ui retry with a new run id", func(t *testing.T) {
		before := e.admitted.Load()
		for i, run := range []string{"r1", "r2"} {
			lb := openLive(t, e, http.MethodPost, "/ag-ui/echo", agui(run, `"hi"`), nil)
			if lb.resp.StatusCode != http.StatusOK {
				t.Fatalf("run %d: %d %s", i, lb.resp.StatusCode, lb.end(t))
			}
			lb.waitFor(t, `"runId":"`+run+`"`)
			lb.resp.Body.Close()
		}
		if n := e.admitted.Load() - before; n != 1 {
			t.Errorf("%d admissions for one message", n)
		}
	})
	t.Run("ag-ui binary not base64", func(t *testing.T) {
		body := strings.Replace(agui("r3", `[{"type":"binary","mimeType":"image/png","data":"not base64!"}]`), `"m1"`, `"m2"`, 1)
		lb := openLive(t, e, http.MethodPost, "/ag-ui/echo", body, nil)
		defer lb.resp.Body.Close()
		if lb.resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("stored: %d", lb.resp.StatusCode)
		}
		if b := lb.end(t); !strings.Contains(b, wire.CodeBadRequest) {
			t.Errorf("%s", b)
		}
	})
	rpc := func(body string) (int, map[string]any) {
		st, _, b := e.postJSON(t, "/a2a/echo", body, nil)
		var resp map[string]any
		if len(b) > 0 {
			if err := json.Unmarshal(b, &resp); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
		}
		return st, resp
	}
	send := func(id, role string) string {
		m := a2aMessage("ctxR", "mR", "hi")
		m["role"] = role
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "SendMessage",
			"params": map[string]any{"message": m, "configuration": map[string]any{"returnImmediately": true}}})
		return string(b)
	}
	for _, c := range []struct {
		name, body string
		code       float64 // of the JSON-RPC error; 0 for none
	}{
		{"a2a agent message as input", send("1", "ROLE_AGENT"), -32602},
		{"a2a batch", "[" + send("1", "ROLE_USER") + "]", -32600},
		{"a2a empty batch", "[]", -32600},
		{"a2a not JSON", "[", -32700},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := e.admitted.Load()
			st, resp := rpc(c.body)
			errObj, _ := resp["error"].(map[string]any)
			if st != http.StatusOK || errObj["code"] != c.code {
				t.Errorf("%d %v, want error %v", st, resp, c.code)
			}
			if e.admitted.Load() != before {
				t.Error("admitted")
			}
		})
	}
	t.Run("a2a notification", func(t *testing.T) {
		before := e.admitted.Load()
		b := strings.Replace(send("1", "ROLE_USER"), `"id":"1",`, "", 1)
		st, h, body := e.postJSON(t, "/a2a/echo", b, nil)
		if st != http.StatusNoContent || len(body) != 0 {
			t.Errorf("%d %v %s", st, h, body)
		}
		if e.admitted.Load() != before {
			t.Error("a notification was run")
		}
	})
}

// countingLog is the real log, counting the submission lookups the server
// makes.
type countingLog struct {
	*log.DB
	subs atomic.Int64
}

func (l *countingLog) Submission(ctx context.Context, id string) (record.Submission, error) {
	l.subs.Add(1)
	return l.DB.Submission(ctx, id)
}

// ListTasks builds only the page's tasks: a page of one out of many
// costs a few lookups, not one task (a read of its turn) per task of the
// context, which made a call of 4,000 tasks take 4 s.
func TestA2AListTasksPaged(t *testing.T) {
	var cl *countingLog
	e := newEnv(t, func(o *envConfig) {
		cl = &countingLog{DB: o.Log.(*log.DB)}
		o.Log = cl
	})
	const n = 150
	for i := range n {
		if st, _, b := e.postJSON(t, "/agents/echo/ctxL", fmt.Sprintf(`{"message":"m%d"}`, i), nil); st != http.StatusAccepted {
			t.Fatalf("%d %s", st, b)
		}
	}
	cl.subs.Store(0)
	resp := a2aCall(t, e, "ListTasks", map[string]any{"contextId": "ctxL", "pageSize": 1})
	res, _ := resp["result"].(map[string]any)
	if tasks, _ := res["tasks"].([]any); len(tasks) != 1 || res["totalSize"] != float64(n) || res["nextPageToken"] != "1" {
		t.Fatalf("%v", resp)
	}
	if got := cl.subs.Load(); got > 4 {
		t.Errorf("a page of one task made %d submission lookups among %d tasks", got, n)
	}
}

// A task's history is its messages: the user's, then the answer; A2A's
// historyLength: absent is all, 0 none, n the last n.
func TestA2ATaskHistory(t *testing.T) {
	e := newEnv(t)
	resp := a2aCall(t, e, "SendMessage", map[string]any{"message": a2aMessage("ctxH", "mH", "question"),
		"configuration": map[string]any{"returnImmediately": true}})
	task := resp["result"].(map[string]any)["task"].(map[string]any)
	id := task["id"].(string)
	hist := func(v any) []any { h, _ := v.(map[string]any)["history"].([]any); return h }
	if h := hist(task); len(h) != 1 || h[0].(map[string]any)["role"] != "ROLE_USER" || h[0].(map[string]any)["messageId"] != "mH" {
		t.Fatalf("SendMessage history: %v", task)
	}
	ft := awaitTurn(t, e, record.Key{Agent: "echo", Instance: "ctxH", Session: "default"}, "turn_h")
	ft.write([]record.Record{ft.message(record.Part{Type: record.PartText, Text: "answer"})}, record.Settlement{SubmissionID: ft.sub, Outcome: record.OutcomeCompleted})
	for _, c := range []struct {
		length any
		roles  string
	}{{nil, "[ROLE_USER ROLE_AGENT]"}, {0, "[]"}, {1, "[ROLE_AGENT]"}, {5, "[ROLE_USER ROLE_AGENT]"}} {
		p := map[string]any{"id": id}
		if c.length != nil {
			p["historyLength"] = c.length
		}
		var roles []any
		for _, m := range hist(a2aCall(t, e, "GetTask", p)["result"]) {
			roles = append(roles, m.(map[string]any)["role"])
		}
		if fmt.Sprint(roles) != c.roles {
			t.Errorf("historyLength %v: roles %v, want %s", c.length, roles, c.roles)
		}
	}
	if e := a2aCall(t, e, "GetTask", map[string]any{"id": id, "historyLength": -1})["error"]; e == nil {
		t.Error("a negative historyLength was taken")
	}
}
