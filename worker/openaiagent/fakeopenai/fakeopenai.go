// Package fakeopenai is a local Chat Completions server for tests that
// speaks the streaming wire format byte for byte as OpenAI does: one
// `data: {chat.completion.chunk}` SSE event per chunk with a blank line
// after each, the role in the first delta, tool-call arguments split over
// chunks keyed by index (id, type and name in the first only), the
// finish_reason on the last choice chunk, the usage chunk with empty
// choices when stream_options.include_usage is set, then `data: [DONE]`.
// Errors are OpenAI's JSON error bodies. Streams can be slow (a delay per
// chunk) or stall (stop sending and hold the connection), and the server
// records when a client closes its request.
//
// The format is checked against the official parsers, not our own
// assumptions: the tests of this package run openai-go's streaming client
// and ChatCompletionAccumulator over it (content, reasoning_content, two
// interleaved tool calls, usage, error bodies). It was also checked once by
// hand with the openai npm package 4.104.0 (chat.completions.stream,
// finalChatCompletion, RateLimitError): same content, tool calls and usage.
package fakeopenai

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Chunk is one streamed delta.
type Chunk struct {
	Content   string
	Reasoning string // sent as delta.reasoning_content, as vLLM and llama.cpp do
	ToolCalls []ToolCallDelta
}

// ToolCallDelta is a fragment of a tool call. ID and Name go in the first
// fragment of an index only, as OpenAI sends them.
type ToolCallDelta struct {
	Index     int
	ID, Name  string
	Arguments string
}

// Response is how one request is answered.
type Response struct {
	// Status other than 0 and 200 answers with an error body.
	Status  int
	Error   APIError
	Headers map[string]string
	// Chunks are streamed in order; FinishReason ("stop", "tool_calls",
	// "length") goes on the last choice chunk. Default "stop", or
	// "tool_calls" when a chunk has tool calls.
	Chunks       []Chunk
	FinishReason string
	// Delay is slept before each chunk (a slow stream).
	Delay time.Duration
	// StallAfter > 0 stops sending after that many chunks and holds the
	// connection open until the client closes it (a stalled stream).
	StallAfter int
	// CutAfter > 0 closes the connection abruptly after that many chunks.
	CutAfter int
}

// APIError is the error object of an error body.
type APIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// Server is a running fake.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	script   []Response
	requests []Request
	closed   chan time.Time // a client closed a held (stalled or slow) stream
	started  chan struct{}  // a stream sent its first chunk
}

// Request is a request the server received, decoded.
type Request struct {
	Header http.Header
	Body   map[string]any
}

// Messages are the request's messages.
func (r Request) Messages() []map[string]any {
	var out []map[string]any
	ms, _ := r.Body["messages"].([]any)
	for _, m := range ms {
		mm, _ := m.(map[string]any)
		out = append(out, mm)
	}
	return out
}

// New starts a server answering requests with script, in order; past its
// end it answers with its last response.
func New(script ...Response) *Server {
	s := &Server{script: script, closed: make(chan time.Time, 16), started: make(chan struct{}, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, APIError{Message: "Invalid URL (" + r.Method + " " + r.URL.Path + ")", Type: "invalid_request_error"}, nil)
	})
	s.Server = httptest.NewServer(mux)
	return s
}

// BaseURL is the URL to configure a client with (…/v1).
func (s *Server) BaseURL() string { return s.URL + "/v1" }

// Requests are the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Closed delivers the time a client closed a stream the server was still
// holding open.
func (s *Server) Closed() <-chan time.Time { return s.closed }

// Started is signalled when a stream has sent its first chunk.
func (s *Server) Started() <-chan struct{} { return s.started }

func (s *Server) next() Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := len(s.requests) - 1
	if i >= len(s.script) {
		i = len(s.script) - 1
	}
	if i < 0 {
		return Response{Chunks: []Chunk{{Content: "ok"}}}
	}
	return s.script[i]
}

func (s *Server) noteClosed() {
	select {
	case s.closed <- time.Now():
	default: // nobody is measuring
	}
}

func str(s string) *string { return &s }

func writeError(w http.ResponseWriter, status int, e APIError, headers map[string]string) {
	for k, v := range headers {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.MarshalIndent(map[string]APIError{"error": e}, "", "  ")
	w.Write(append(b, '\n'))
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	raw, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(raw, &body); err != nil {
		writeError(w, http.StatusBadRequest, APIError{Message: "We could not parse the JSON body of your request.", Type: "invalid_request_error"}, nil)
		return
	}
	s.mu.Lock()
	s.requests = append(s.requests, Request{Header: r.Header.Clone(), Body: body})
	s.mu.Unlock()
	resp := s.next()
	if resp.Status != 0 && resp.Status != http.StatusOK {
		e := resp.Error
		if e.Message == "" {
			e = APIError{Message: http.StatusText(resp.Status), Type: "server_error"}
		}
		writeError(w, resp.Status, e, resp.Headers)
		return
	}
	if stream, _ := body["stream"].(bool); !stream {
		writeError(w, http.StatusBadRequest, APIError{Message: "this fake only streams", Type: "invalid_request_error"}, nil)
		return
	}
	model, _ := body["model"].(string)
	includeUsage := false
	if so, ok := body["stream_options"].(map[string]any); ok {
		includeUsage, _ = so["include_usage"].(bool)
	}
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	id := fmt.Sprintf("chatcmpl-fake%d", time.Now().UnixNano())
	created := time.Now().Unix()
	usageField := ""
	if includeUsage {
		usageField = `,"usage":null`
	}
	send := func(choice string) bool {
		line := fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"service_tier":"default","system_fingerprint":"fp_fake","choices":[%s]%s}`+"\n\n", id, created, model, choice, usageField)
		if _, err := io.WriteString(w, line); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	wait := func(d time.Duration) bool {
		if d <= 0 {
			if r.Context().Err() != nil {
				// The client left between two chunks: a close all the
				// same (missing this note made TestStopClosesUpstream
				// wait 10 s for one when the client was quick).
				s.noteClosed()
				return false
			}
			return true
		}
		select {
		case <-r.Context().Done():
			s.noteClosed()
			return false
		case <-time.After(d):
			return true
		}
	}
	finish := resp.FinishReason
	seenTools := map[int]bool{}
	for i, c := range resp.Chunks {
		if resp.StallAfter > 0 && i == resp.StallAfter {
			<-r.Context().Done()
			s.noteClosed()
			return
		}
		if resp.CutAfter > 0 && i == resp.CutAfter {
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		}
		if !wait(resp.Delay) {
			return
		}
		delta := map[string]any{}
		if i == 0 {
			delta["role"] = "assistant"
			delta["refusal"] = nil
			if len(c.ToolCalls) > 0 {
				delta["content"] = nil
			} else {
				delta["content"] = ""
			}
		}
		if c.Content != "" {
			delta["content"] = c.Content
		}
		if c.Reasoning != "" {
			delta["reasoning_content"] = c.Reasoning
		}
		if len(c.ToolCalls) > 0 {
			if finish == "" {
				finish = "tool_calls"
			}
			var tcs []map[string]any
			for _, tc := range c.ToolCalls {
				m := map[string]any{"index": tc.Index}
				fn := map[string]any{"arguments": tc.Arguments}
				if !seenTools[tc.Index] {
					seenTools[tc.Index] = true
					m["id"], m["type"] = tc.ID, "function"
					fn["name"] = tc.Name
				}
				m["function"] = fn
				tcs = append(tcs, m)
			}
			delta["tool_calls"] = tcs
		}
		d, _ := json.Marshal(delta)
		if !send(fmt.Sprintf(`{"index":0,"delta":%s,"logprobs":null,"finish_reason":null}`, d)) {
			return
		}
		if i == 0 {
			select {
			case s.started <- struct{}{}:
			default:
			}
		}
	}
	if resp.StallAfter > 0 && resp.StallAfter >= len(resp.Chunks) {
		<-r.Context().Done()
		s.noteClosed()
		return
	}
	if finish == "" {
		finish = "stop"
	}
	if !send(fmt.Sprintf(`{"index":0,"delta":{},"logprobs":null,"finish_reason":%q}`, finish)) {
		return
	}
	if includeUsage {
		n := 0
		for _, c := range resp.Chunks {
			n += len(strings.Fields(c.Content)) + 1
		}
		u := fmt.Sprintf(`data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"service_tier":"default","system_fingerprint":"fp_fake","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`+"\n\n", id, created, model, n, n+12)
		io.WriteString(w, u)
	}
	io.WriteString(w, "data: [DONE]\n\n")
	rc.Flush()
}

// Errors as OpenAI sends them.
var (
	ErrInvalidKey = Response{Status: http.StatusUnauthorized, Error: APIError{
		Message: "Incorrect API key provided: sk-fake. You can find your API key at https://platform.openai.com/account/api-keys.",
		Type:    "invalid_request_error", Code: str("invalid_api_key"),
	}}
	ErrUnknownModel = Response{Status: http.StatusNotFound, Error: APIError{
		Message: "The model `nope` does not exist or you do not have access to it.",
		Type:    "invalid_request_error", Code: str("model_not_found"),
	}}
	ErrRateLimited = Response{Status: http.StatusTooManyRequests, Headers: map[string]string{"Retry-After": "0"}, Error: APIError{
		Message: "Rate limit reached for gpt-4o-mini in organization org-fake on requests per min (RPM): Limit 3, Used 3, Requested 1.",
		Type:    "requests", Code: str("rate_limit_exceeded"),
	}}
	ErrOverloaded = Response{Status: http.StatusServiceUnavailable, Error: APIError{
		Message: "The server is overloaded or not ready yet.", Type: "server_error",
	}}
)
