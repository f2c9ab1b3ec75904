// Package openaiagent is the openai agent kind: any OpenAI-compatible Chat
// Completions endpoint (OpenAI, vLLM, llama.cpp's server, Ollama, LM
// Studio), streaming, through the official Go SDK.
//
// The agent holds no conversation state. Each turn rebuilds the messages
// sent to the model from the conversation's active path (the History the
// agent is given reads the log through package projection), so that it
// follows rewinds and forks and any worker can run any turn.
//
// Text deltas become text events; reasoning deltas (reasoning_content, or
// reasoning, where a server sends them) become thinking events. Declared
// tools are called by POSTing their arguments to the tool's URL; the model
// is called again with the results, up to MaxSteps calls per turn. A
// call of a tool whose Approval is required is not made: the turn asks a
// person (approval_requested) and ends, and the turn that resumes it with
// the decisions makes or denies the call (see Agent.Invoke).
package openaiagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/shared"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/egress"
)

// History gives the messages of a conversation's active path, the
// current turn's own user messages included.
type History interface {
	Messages(ctx context.Context, scope worker.Scope) ([]projection.Message, error)
}

// HistoryFunc adapts a function to History.
type HistoryFunc func(ctx context.Context, scope worker.Scope) ([]projection.Message, error)

// Messages calls f.
func (f HistoryFunc) Messages(ctx context.Context, scope worker.Scope) ([]projection.Message, error) {
	return f(ctx, scope)
}

// Tool is a function the model may call: convlog POSTs the arguments (a
// JSON object) to URL, and the JSON answer is the result. A non-2xx answer,
// an unreachable or refused URL, or an answer over MaxToolAnswer is a
// result marked isError.
//
// A tool call applies egress.Policy{AllowPrivate: tool.AllowPrivate}: its
// answer is stored in the conversation, read by all its readers and sent
// to the model, and its body is written by the model, so by default it
// reaches public addresses only.
type Tool struct {
	Name        string
	Description string
	Parameters  map[string]any // JSON schema
	URL         string
	// AllowPrivate lets the call reach loopback and private networks (a
	// tool served next to convlog).
	AllowPrivate bool
	// Approval is ApprovalNone ("" too) or ApprovalRequired: a call of a
	// required tool is not made until a person approves it (see Invoke).
	Approval string
}

// Tool approval values.
const (
	ApprovalNone     = "none"
	ApprovalRequired = "required"
)

// DeniedReason is the reason of a denial that gave none.
const DeniedReason = "denied by a person"

// MaxToolAnswer bounds the body of a tool's answer.
const MaxToolAnswer = 4 << 20

// Tool clients, by AllowPrivate.
var toolClients = [2]*http.Client{egress.Policy{}.Client(), egress.Policy{AllowPrivate: true}.Client()}

// modelClient is the model endpoint's: the operator named the URL, so
// loopback and private networks are allowed (Ollama, vLLM next door);
// metadata and link-local addresses and cross-origin redirects are not.
var modelClient = egress.Policy{AllowPrivate: true}.Client()

// Failure codes of the openai kind.
const (
	CodeRateLimited         = "rate_limited"         // 429 after every attempt
	CodeUpstreamUnavailable = "upstream_unavailable" // 5xx or unreachable after every attempt, or cut mid-stream
	CodeUpstreamRejected    = "upstream_rejected"    // 4xx: bad key, unknown model, bad request
	CodeMaxSteps            = "max_steps_exceeded"   // the model still called tools after MaxSteps calls
	CodeHistory             = "history_unreadable"   // the conversation could not be read
	CodeReplyTooLarge       = "reply_too_large"      // the tool calls' arguments outgrew the log's batch limit
)

// Agent calls Model at BaseURL.
type Agent struct {
	BaseURL string // e.g. http://127.0.0.1:11434/v1; "" is OpenAI's
	APIKey  string
	Model   string
	System  string
	Tools   []Tool
	History History // the conversation so far; nil sends the prompt alone

	MaxSteps    int           // model calls per turn; default 8
	MaxAttempts int           // per model call; default 3
	Temperature *float64      // nil: the server's default
	MaxTokens   int           // 0: the server's default
	ToolTimeout time.Duration // per tool call; default 60s
	// Backoff is the delay before retry n (1, 2, ...) when the server sent
	// no Retry-After. Default 500ms doubling, at most 8s.
	Backoff func(n int) time.Duration
	// HTTPClient makes the model calls; nil applies
	// egress.Policy{AllowPrivate: true} and same-origin redirects only.
	// Tool calls never use it (see Tool).
	HTTPClient *http.Client

	once   sync.Once
	client openai.Client
}

func (a *Agent) init() {
	a.once.Do(func() {
		opts := []option.RequestOption{
			option.WithMaxRetries(0), // ours announce themselves as retrying events
			option.WithAPIKey(a.APIKey),
		}
		if a.BaseURL != "" {
			opts = append(opts, option.WithBaseURL(a.BaseURL))
		}
		client := a.HTTPClient
		if client == nil {
			client = modelClient
		}
		opts = append(opts, option.WithHTTPClient(client))
		a.client = openai.NewClient(opts...)
		if a.MaxSteps <= 0 {
			a.MaxSteps = 8
		}
		if a.MaxAttempts <= 0 {
			a.MaxAttempts = 3
		}
		if a.ToolTimeout <= 0 {
			a.ToolTimeout = 60 * time.Second
		}
		if a.Backoff == nil {
			a.Backoff = func(n int) time.Duration {
				return min(500*time.Millisecond<<(n-1), 8*time.Second)
			}
		}
	})
}

// Invoke implements worker.Agent.
//
// In a step where the model calls tools, each call gets its tool_started
// in the model's order; a call of a tool whose Approval is required is
// held (not made), the others are made at once and get their tool_ended.
// If any call was held, the turn then emits approval_requested for each
// held call (its ID is the tool call's) and completes, without calling
// the model again.
//
// With prompt.Resume, the turn continues such a step: the messages are
// rebuilt from History, and each decided call gets its result in the
// decisions' order, an approved one by making the call (with the edited
// Input when there is one) and a denied one as the error result
// {"error":"denied","reason":...}, which the model sees as the tool
// message; then the model is called, as in any step.
func (a *Agent) Invoke(ctx context.Context, scope worker.Scope, prompt worker.Prompt) iter.Seq[worker.Event] {
	return func(yield func(worker.Event) bool) {
		a.init()
		var history []projection.Message
		var err error
		if a.History != nil {
			history, err = a.History.Messages(ctx, scope)
		}
		if err != nil {
			if ctx.Err() == nil {
				yield(worker.Failed("read the conversation: "+err.Error(), true, CodeHistory))
			}
			return
		}
		var results map[string]string
		if prompt.Resume != nil {
			var ok bool
			if results, ok = a.resume(ctx, answered(history), prompt.Resume.Decisions, yield); !ok {
				return
			}
		}
		msgs := a.messages(history, results)
		if len(msgs) == 0 || (a.System != "" && len(msgs) == 1) {
			// A history without the prompt (a reader lagging behind): the
			// prompt is what the turn answers.
			msgs = append(msgs, openai.UserMessage(prompt.Text))
		}
		for step := 1; ; step++ {
			calls, ok := a.step(ctx, msgs, yield)
			if !ok {
				return // failed, stopped or cancelled: already said
			}
			if len(calls) == 0 {
				yield(worker.Completed(nil))
				return
			}
			if step >= a.MaxSteps {
				yield(worker.Failed(fmt.Sprintf("the model still called tools after %d calls (maxSteps)", a.MaxSteps), false, CodeMaxSteps))
				return
			}
			assistant := openai.ChatCompletionAssistantMessageParam{}
			if text := calls[0].text; text != "" {
				assistant.Content.OfString = param.NewOpt(text)
			}
			var results []openai.ChatCompletionMessageParamUnion
			var held []worker.Event
			for _, c := range calls {
				assistant.ToolCalls = append(assistant.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
						ID: c.id, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.name, Arguments: c.args.String()},
					},
				})
				args := json.RawMessage(c.args.String())
				if !json.Valid(args) {
					args, _ = json.Marshal(c.args.String())
				}
				if !yield(worker.ToolStarted(c.id, c.name, args)) {
					return
				}
				if a.requiresApproval(c.name) {
					held = append(held, worker.ApprovalRequested(c.id, c.name, args))
					continue
				}
				out, isErr := a.callTool(ctx, c.name, args)
				if ctx.Err() != nil {
					return
				}
				if !yield(worker.ToolEnded(c.id, isErr, out)) {
					return
				}
				results = append(results, openai.ToolMessage(string(out), c.id))
			}
			if len(held) > 0 {
				for _, ev := range held {
					if !yield(ev) {
						return
					}
				}
				yield(worker.Completed(nil))
				return
			}
			msgs = append(msgs, openai.ChatCompletionMessageParamUnion{OfAssistant: &assistant})
			msgs = append(msgs, results...)
		}
	}
}

// requiresApproval reports whether a call of the named tool waits for a
// person.
func (a *Agent) requiresApproval(name string) bool {
	for _, t := range a.Tools {
		if t.Name == name {
			return t.Approval == ApprovalRequired
		}
	}
	return false
}

// resume gives each decided call its result, by tool call id: the
// tool's answer for an approved call, made with the edited Input when
// there is one, and the denial for a denied one. A call whose result the
// history holds already (done) is not made again. ok is false when the
// turn is over (the caller stopped, or ctx ended).
func (a *Agent) resume(ctx context.Context, done map[string]bool, decisions []worker.Decision, yield func(worker.Event) bool) (_ map[string]string, ok bool) {
	results := map[string]string{}
	for _, d := range decisions {
		if done[d.ToolCallID] {
			continue
		}
		var out json.RawMessage
		var isErr bool
		if d.Approved {
			input := d.Input
			if len(input) == 0 || string(input) == "null" {
				input = d.Args
			}
			if len(input) == 0 {
				input = json.RawMessage(`{}`)
			}
			out, isErr = a.callTool(ctx, d.ToolName, input)
			if ctx.Err() != nil {
				return nil, false
			}
		} else {
			reason := d.Reason
			if reason == "" {
				reason = DeniedReason
			}
			out, _ = json.Marshal(map[string]string{"error": "denied", "reason": reason})
			isErr = true
		}
		if !yield(worker.ToolEnded(d.ToolCallID, isErr, out)) {
			return nil, false
		}
		results[d.ToolCallID] = string(out)
	}
	return results, true
}

// answered is the set of tool calls of the history that have a result.
func answered(history []projection.Message) map[string]bool {
	done := map[string]bool{}
	for _, m := range history {
		for _, p := range m.Parts {
			if p.Type == projection.PartTool && hasResult(p) {
				done[p.ToolCallID] = true
			}
		}
	}
	return done
}

func hasResult(p projection.Part) bool {
	return p.State == projection.StateOutputAvailable || p.State == projection.StateOutputError
}

// toolCall is a tool call being streamed, keyed by its index.
type toolCall struct {
	index    int64
	id, name string
	args     strings.Builder
	text     string // the text the model wrote before its calls (first call only)
}

// step is one model call: it streams deltas as events and returns the
// tool calls the model made. ok is false when the turn is over (a failed
// event was yielded, or the caller stopped, or ctx ended).
func (a *Agent) step(ctx context.Context, msgs []openai.ChatCompletionMessageParamUnion, yield func(worker.Event) bool) (calls []*toolCall, ok bool) {
	params := openai.ChatCompletionNewParams{
		Model:         shared.ChatModel(a.Model),
		Messages:      msgs,
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)},
	}
	if a.Temperature != nil {
		params.Temperature = param.NewOpt(*a.Temperature)
	}
	if a.MaxTokens > 0 {
		params.MaxCompletionTokens = param.NewOpt(int64(a.MaxTokens))
	}
	for _, t := range a.Tools {
		fn := shared.FunctionDefinitionParam{Name: t.Name, Parameters: shared.FunctionParameters(t.Parameters)}
		if t.Description != "" {
			fn.Description = param.NewOpt(t.Description)
		}
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(fn))
	}
	for attempt := 1; ; attempt++ {
		calls, streamed, err := a.stream(ctx, params, yield)
		if err == nil {
			return calls, true
		}
		if errors.Is(err, errStopped) || ctx.Err() != nil {
			return nil, false
		}
		if errors.Is(err, errArgsTooLarge) {
			yield(worker.Failed(err.Error(), false, CodeReplyTooLarge))
			return nil, false
		}
		code, retryable, retryAfter := classify(err)
		if streamed || !retryable || attempt >= a.MaxAttempts {
			if streamed {
				code, retryable = CodeUpstreamUnavailable, true
			}
			yield(worker.Failed(describe(err), retryable, code))
			return nil, false
		}
		delay := retryAfter
		if delay <= 0 {
			delay = a.Backoff(attempt)
		}
		if !yield(worker.Event{Type: worker.EventRetrying, Attempt: attempt, MaxAttempts: a.MaxAttempts, DelayMs: delay.Milliseconds(), Reason: describe(err)}) {
			return nil, false
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, false
		case <-t.C:
		}
	}
}

var errStopped = errors.New("the caller stopped")

// maxToolArgs bounds the tool-call arguments (and names) of one model
// call, as they stream: a call's input is stored as one record, so more
// than the log's batch limit could never be stored, and a server sending
// fragments without end must not grow our memory until it stops.
const maxToolArgs = record.MaxBatchBytes

// errArgsTooLarge is the error of a stream whose tool calls outgrew
// maxToolArgs.
var errArgsTooLarge = fmt.Errorf("the model's tool-call arguments are longer than %d bytes, the log's batch limit", maxToolArgs)

// stream runs one streaming request. streamed says whether any event came
// out of it (after which a retry would repeat them).
func (a *Agent) stream(ctx context.Context, params openai.ChatCompletionNewParams, yield func(worker.Event) bool) (calls []*toolCall, streamed bool, err error) {
	// Its own context: whatever ends the call (a stop, a failure) closes
	// the upstream request at once, not when the body is next read.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := a.client.Chat.Completions.NewStreaming(ctx, params)
	defer s.Close()
	byIndex := map[int64]*toolCall{}
	argBytes := 0
	var text strings.Builder
	emit := func(ev worker.Event) bool {
		streamed = true
		return yield(ev)
	}
	for s.Next() {
		chunk := s.Current()
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue // n=1: one choice
			}
			d := ch.Delta
			if r := reasoning(d); r != "" && !emit(worker.Thinking(r)) {
				return nil, true, errStopped
			}
			if d.Content != "" {
				text.WriteString(d.Content)
				if !emit(worker.Text(d.Content)) {
					return nil, true, errStopped
				}
			}
			for _, tc := range d.ToolCalls {
				if argBytes += len(tc.Function.Arguments) + len(tc.Function.Name); argBytes > maxToolArgs {
					return nil, streamed, errArgsTooLarge
				}
				c := byIndex[tc.Index]
				if c == nil {
					c = &toolCall{index: tc.Index}
					byIndex[tc.Index] = c
				}
				if tc.ID != "" {
					c.id = tc.ID
				}
				if tc.Function.Name != "" {
					c.name += tc.Function.Name
				}
				c.args.WriteString(tc.Function.Arguments)
				if tc.Function.Arguments != "" && !emit(worker.ToolInputDelta(c.id, c.name, tc.Function.Arguments)) {
					return nil, true, errStopped
				}
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, streamed, err
	}
	for _, c := range byIndex {
		if c.id == "" {
			c.id = "call_" + strconv.FormatInt(c.index, 10)
		}
		calls = append(calls, c)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].index < calls[j].index })
	if len(calls) > 0 {
		calls[0].text = text.String()
	}
	return calls, streamed, nil
}

// reasoning is a delta's reasoning text: reasoning_content (vLLM, llama.cpp,
// DeepSeek) or reasoning (Ollama, OpenRouter).
func reasoning(d openai.ChatCompletionChunkChoiceDelta) string {
	for _, k := range []string{"reasoning_content", "reasoning"} {
		if f, ok := d.JSON.ExtraFields[k]; ok {
			var s string
			if json.Unmarshal([]byte(f.Raw()), &s) == nil && s != "" {
				return s
			}
		}
	}
	return ""
}

// classify says what a failed call means: its failure code, whether
// another attempt may succeed, and the server's Retry-After.
func classify(err error) (code string, retryable bool, retryAfter time.Duration) {
	if errors.Is(err, egress.ErrRefused) {
		return egress.CodeRefused, false, 0 // only a configuration change makes it pass
	}
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		return CodeUpstreamUnavailable, true, 0 // unreachable, reset, malformed stream
	}
	if apiErr.Response != nil {
		retryAfter = parseRetryAfter(apiErr.Response.Header)
	}
	switch s := apiErr.StatusCode; {
	case s == http.StatusTooManyRequests:
		return CodeRateLimited, true, retryAfter
	case s >= 500, s == http.StatusRequestTimeout, s == http.StatusConflict:
		return CodeUpstreamUnavailable, true, retryAfter
	}
	return CodeUpstreamRejected, false, 0
}

func parseRetryAfter(h http.Header) time.Duration {
	if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms > 0 {
		return min(time.Duration(ms*float64(time.Millisecond)), time.Minute)
	}
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
		return min(time.Duration(s*float64(time.Second)), time.Minute)
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), time.Minute)
	}
	return 0
}

// describe is the upstream's own message where there is one.
func describe(err error) string {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		msg := apiErr.Message
		if msg == "" {
			msg = http.StatusText(apiErr.StatusCode)
		}
		return fmt.Sprintf("upstream answered %d: %s", apiErr.StatusCode, msg)
	}
	return "upstream: " + err.Error()
}

// callTool POSTs args to the tool's URL. The result is the JSON answer, or
// an error object marked isError.
func (a *Agent) callTool(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, bool) {
	errResult := func(format string, v ...any) (json.RawMessage, bool) {
		b, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(format, v...)})
		return b, true
	}
	var tool *Tool
	for i := range a.Tools {
		if a.Tools[i].Name == name {
			tool = &a.Tools[i]
		}
	}
	if tool == nil {
		return errResult("no tool named %q", name)
	}
	ctx, cancel := context.WithTimeout(ctx, a.ToolTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tool.URL, bytes.NewReader(args))
	if err != nil {
		return errResult("tool %s: %v", name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := toolClients[0]
	if tool.AllowPrivate {
		client = toolClients[1]
	}
	resp, err := client.Do(req)
	if err != nil {
		var refused *egress.RefusedError
		if errors.As(err, &refused) && refused.Hint != "" {
			return errResult("tool %s: refused: %s is %s; set allowPrivate: true on the tool to allow it", name, refused.Addr, refused.Reason)
		}
		return errResult("tool %s: %v", name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxToolAnswer+1))
	if err != nil {
		return errResult("tool %s: %v", name, err)
	}
	if len(body) > MaxToolAnswer {
		// A cut body is neither the tool's JSON nor its whole text: the
		// model must not take it for the answer.
		return errResult("tool %s: the answer is over %d MiB; not used", name, MaxToolAnswer>>20)
	}
	out := json.RawMessage(bytes.TrimSpace(body))
	if !json.Valid(out) {
		out, _ = json.Marshal(string(body))
	}
	return out, resp.StatusCode/100 != 2
}

// messages turns the active path into Chat Completions messages. results
// are the results of the calls a resumed turn has just decided, which the
// history does not hold yet.
func (a *Agent) messages(history []projection.Message, results map[string]string) []openai.ChatCompletionMessageParamUnion {
	var out []openai.ChatCompletionMessageParamUnion
	if a.System != "" {
		out = append(out, openai.SystemMessage(a.System))
	}
	for _, m := range history {
		switch m.Role {
		case projection.RoleUser:
			var parts []openai.ChatCompletionContentPartUnionParam
			var text strings.Builder
			for _, p := range m.Parts {
				switch {
				case p.Type == "text":
					text.WriteString(p.Text)
				case p.Type == "file" && strings.HasPrefix(p.URL, "data:image/"):
					parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: p.URL}))
				}
			}
			if len(parts) == 0 {
				out = append(out, openai.UserMessage(text.String()))
				continue
			}
			parts = append([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart(text.String())}, parts...)
			out = append(out, openai.UserMessage(parts))
		case projection.RoleAssistant:
			out = append(out, assistantMessages(m, results)...)
		}
	}
	return out
}

// assistantMessages is one assistant message (its text and tool calls)
// and the tool messages of its calls' results. A call left without a
// result gets its entry of results (a decision of a resumed turn) or, when
// there is none (its turn was cut short), one saying so, since the API
// refuses a call without an answer.
func assistantMessages(m projection.Message, results map[string]string) []openai.ChatCompletionMessageParamUnion {
	var text strings.Builder
	asst := openai.ChatCompletionAssistantMessageParam{}
	var msgs []openai.ChatCompletionMessageParamUnion
	for _, p := range m.Parts {
		switch p.Type {
		case "text":
			text.WriteString(p.Text)
		case projection.PartTool:
			args := string(p.Input)
			if args == "" || args == "null" {
				args = "{}"
			}
			asst.ToolCalls = append(asst.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{ID: p.ToolCallID, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: p.ToolName, Arguments: args}},
			})
			content := string(p.Output)
			r, decided := results[p.ToolCallID]
			switch {
			case decided && !hasResult(p):
				content = r
			case p.State == projection.StateInputAvailable, content == "" && p.ErrorText == "" && !hasResult(p):
				content = `{"error":"no result: the turn was cut short"}`
			case content == "" && p.ErrorText != "":
				content = p.ErrorText
			}
			msgs = append(msgs, openai.ToolMessage(content, p.ToolCallID))
		}
	}
	if text.Len() == 0 && len(asst.ToolCalls) == 0 {
		return nil
	}
	if text.Len() > 0 {
		asst.Content.OfString = param.NewOpt(text.String())
	}
	return append([]openai.ChatCompletionMessageParamUnion{{OfAssistant: &asst}}, msgs...)
}
