package transport

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/internal/conversation/turnview"
	"github.com/convlog/convlog/log"
	"github.com/labstack/echo/v4"
	"github.com/oklog/ulid/v2"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// The A2A adapter: A2A 1.0 over its JSON-RPC binding.
//
//	GET  /a2a/:agent/.well-known/agent-card.json   the agent card
//	GET  /.well-known/agent-card.json              the card of Options.A2ADefaultAgent
//	POST /a2a/:agent                               JSON-RPC 2.0
//
// A task is a submission: its id is the submission id, its contextId the
// instance (session "default"; generated when the message has none), its
// state the submission's status, its answer the "output" text artifact,
// read from the log. Nothing about a task lives anywhere else, so a task
// outlives any restart, and SubscribeToTask replays it from the log.

const (
	a2aVersionHeader = "A2A-Version"
	a2aVersion       = "1.0"
	a2aArtifactID    = "output"
)

// JSON-RPC and A2A error codes.
const (
	rpcParseError            = -32700
	rpcInvalidRequest        = -32600
	rpcMethodNotFound        = -32601
	rpcInvalidParams         = -32602
	rpcInternalError         = -32603
	a2aTaskNotFound          = -32001
	a2aTaskNotCancelable     = -32002
	a2aPushNotSupported      = -32003
	a2aUnsupportedOperation  = -32004
	a2aExtendedCardNotConfig = -32007
	a2aVersionNotSupported   = -32009
)

// A2A task states (the protocol's JSON enum names).
const (
	taskSubmitted = "TASK_STATE_SUBMITTED"
	taskWorking   = "TASK_STATE_WORKING"
	taskCompleted = "TASK_STATE_COMPLETED"
	taskFailed    = "TASK_STATE_FAILED"
	taskCanceled  = "TASK_STATE_CANCELED"
	// taskInputRequired is a submission waiting for a person's approval
	// of tool calls (input_required).
	taskInputRequired = "TASK_STATE_INPUT_REQUIRED"
)

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Message }

func rpcErr(code int, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: record.Clip(fmt.Sprintf(format, args...), 1024)}
}

type rpcRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// Wire types of A2A 1.0 (the subset this server produces and reads).
type (
	a2aPart struct {
		Text      *string         `json:"text,omitempty"`
		Raw       string          `json:"raw,omitempty"`
		URL       string          `json:"url,omitempty"`
		Data      json.RawMessage `json:"data,omitempty"`
		Filename  string          `json:"filename,omitempty"`
		MediaType string          `json:"mediaType,omitempty"`
	}
	a2aMessage struct {
		MessageID string    `json:"messageId"`
		ContextID string    `json:"contextId,omitempty"`
		TaskID    string    `json:"taskId,omitempty"`
		Role      string    `json:"role"`
		Parts     []a2aPart `json:"parts"`
	}
	a2aStatus struct {
		State     string      `json:"state"`
		Message   *a2aMessage `json:"message,omitempty"`
		Timestamp string      `json:"timestamp,omitempty"`
	}
	a2aArtifact struct {
		ArtifactID string    `json:"artifactId"`
		Name       string    `json:"name,omitempty"`
		Parts      []a2aPart `json:"parts"`
	}
	a2aTask struct {
		ID        string        `json:"id"`
		ContextID string        `json:"contextId"`
		Status    a2aStatus     `json:"status"`
		Artifacts []a2aArtifact `json:"artifacts,omitempty"`
		// History is the task's messages: the user's, then the agent's
		// answer once it has text.
		History []a2aMessage `json:"history,omitempty"`
	}
	a2aStatusUpdate struct {
		TaskID    string    `json:"taskId"`
		ContextID string    `json:"contextId"`
		Status    a2aStatus `json:"status"`
	}
	a2aArtifactUpdate struct {
		TaskID    string      `json:"taskId"`
		ContextID string      `json:"contextId"`
		Artifact  a2aArtifact `json:"artifact"`
		Append    bool        `json:"append,omitempty"`
		LastChunk bool        `json:"lastChunk,omitempty"`
	}
	a2aStreamResponse struct {
		Task           *a2aTask           `json:"task,omitempty"`
		StatusUpdate   *a2aStatusUpdate   `json:"statusUpdate,omitempty"`
		ArtifactUpdate *a2aArtifactUpdate `json:"artifactUpdate,omitempty"`
	}
)

func textPart(s string) a2aPart { return a2aPart{Text: &s} }

// a2aCard is GET /a2a/:agent/.well-known/agent-card.json.
func (s *Server) a2aCard(c echo.Context) error {
	agent, err := s.adapterAgent(c)
	if err != nil {
		return err
	}
	return s.writeCard(c, agent)
}

// a2aDefaultCard is GET /.well-known/agent-card.json: the card of the agent
// the operator named as the default, 404 when none.
func (s *Server) a2aDefaultCard(c echo.Context) error {
	agent := s.opts.A2ADefaultAgent
	if agent == "" {
		return apiErr(http.StatusNotFound, wire.CodeNotFound, "no default A2A agent is configured (see --a2a-default-agent); the cards are at /a2a/<agent>/.well-known/agent-card.json")
	}
	if err := s.agentExists(agent); err != nil {
		return err
	}
	return s.writeCard(c, agent)
}

func (s *Server) writeCard(c echo.Context, agent string) error {
	req := c.Request()
	scheme := "http"
	if req.TLS != nil {
		scheme = "https"
	}
	if p := req.Header.Get("X-Forwarded-Proto"); p == "https" || p == "http" {
		scheme = p
	}
	endpoint := scheme + "://" + req.Host + "/a2a/" + url.PathEscape(agent)
	card := map[string]any{
		"name":        agent,
		"description": "convlog agent " + agent + ": durable conversations; tasks survive restarts and can be re-subscribed from the log",
		"version":     "1.0.0",
		"url":         endpoint,
		"supportedInterfaces": []map[string]string{
			{"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": a2aVersion},
		},
		"capabilities":       map[string]bool{"streaming": true, "pushNotifications": false},
		"defaultInputModes":  []string{"text/plain"},
		"defaultOutputModes": []string{"text/plain"},
		"skills": []map[string]any{
			{"id": "converse", "name": "converse", "description": "answers messages in a durable conversation (contextId)", "tags": []string{"chat"}},
		},
	}
	if s.opts.Auth != nil {
		// Tell callers what the JSON-RPC endpoint wants: a bearer token.
		card["securitySchemes"] = map[string]any{"bearer": map[string]any{
			"httpAuthSecurityScheme": map[string]string{"scheme": "Bearer", "description": "a convlog token (static or JWT) with read/deliver scopes on the context"}}}
		card["securityRequirements"] = []any{map[string]any{"schemes": map[string]any{"bearer": map[string]any{"list": []string{}}}}}
	}
	c.Response().Header().Set(a2aVersionHeader, a2aVersion)
	return writeJSON(c, http.StatusOK, card)
}

// a2aRPC is POST /a2a/:agent: one JSON-RPC request.
func (s *Server) a2aRPC(c echo.Context) error {
	agent, err := adapterAgentName(c)
	if err != nil {
		return err
	}
	// Each method checks its conversation's scopes; a caller with none on
	// this agent is refused before the agent is looked up.
	if p, ok := PrincipalOf(c); ok && !p.AllowsAgent(auth.VerbRead, agent) && !p.AllowsAgent(auth.VerbDeliver, agent) {
		return forbidden()
	}
	err = s.agentExists(agent)
	if err != nil {
		return err
	}
	c.Response().Header().Set(a2aVersionHeader, a2aVersion)
	body, release, err := s.readBody(c)
	if err != nil {
		return err
	}
	// A batch is valid JSON, not a parse error; it is refused as an
	// invalid request (one answer, id null): a batch would multiply what
	// one request may hold, streams and turns.
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' && json.Valid(t) {
		release()
		return s.rpcReply(c, nil, nil, rpcErr(rpcInvalidRequest, "JSON-RPC batches are not supported: send one request per call"))
	}
	var req rpcRequest
	err = json.Unmarshal(body, &req)
	// The answer may stream for a whole turn: the body's share of the
	// budget ends once it is decoded (the decoded params are copies).
	release()
	if err != nil {
		return s.rpcReply(c, nil, nil, rpcErr(rpcParseError, "parse error: %s", describeJSONError(err, "")))
	}
	if req.JSONRPC != "2.0" || req.Method == "" {
		return s.rpcReply(c, req.ID, nil, rpcErr(rpcInvalidRequest, `a JSON-RPC 2.0 request needs "jsonrpc":"2.0" and a "method"`))
	}
	// A notification (no "id") gets no reply, as JSON-RPC requires, and
	// is not run: every A2A method answers something, and a notification
	// of one (a SendMessage, say) would act with nobody to tell.
	if len(req.ID) == 0 {
		return c.NoContent(http.StatusNoContent)
	}
	// Version negotiation: no header means the client takes what the
	// card offers; a version other than 1.x is refused.
	if v := strings.TrimSpace(c.Request().Header.Get(a2aVersionHeader)); v != "" && v != "1" && !strings.HasPrefix(v, "1.") {
		return s.rpcReply(c, req.ID, nil, rpcErr(a2aVersionNotSupported, "A2A version %q is not supported; this server speaks %s", v, a2aVersion))
	}
	a := a2aCall{s: s, c: c, agent: agent, id: req.ID, params: req.Params}
	var result any
	var rerr *rpcError
	switch req.Method {
	case "SendMessage":
		result, rerr = a.sendMessage(false)
	case "SendStreamingMessage":
		rerr = a.sendStreaming()
	case "GetTask":
		result, rerr = a.getTask()
	case "ListTasks":
		result, rerr = a.listTasks()
	case "CancelTask":
		result, rerr = a.cancelTask()
	case "SubscribeToTask":
		rerr = a.subscribe()
	case "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs", "DeleteTaskPushNotificationConfig":
		rerr = rpcErr(a2aPushNotSupported, "push notifications are not supported: use SubscribeToTask, which replays a task from the log")
	case "GetExtendedAgentCard":
		rerr = rpcErr(a2aExtendedCardNotConfig, "there is no extended agent card")
	default:
		rerr = rpcErr(rpcMethodNotFound, "method %q not found", req.Method)
	}
	if a.fail != nil {
		return a.fail // refused at the HTTP level (403, 429), as the other routes do
	}
	if a.streamed {
		return nil // the stream carried the answer (and any error)
	}
	return s.rpcReply(c, req.ID, result, rerr)
}

func (s *Server) rpcReply(c echo.Context, id json.RawMessage, result any, e *rpcError) error {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	resp := rpcResponse{JSONRPC: "2.0", ID: id}
	if e != nil {
		resp.Error = e
	} else {
		resp.Result = result
	}
	return writeJSON(c, http.StatusOK, resp)
}

type a2aCall struct {
	s        *Server
	c        echo.Context
	agent    string
	id       json.RawMessage
	params   json.RawMessage
	streamed bool
	fail     error // an HTTP-level refusal, set by deny
}

// deny makes the call fail with err as an HTTP error instead of a JSON-RPC
// one: access control and limits answer as on every route.
func (a *a2aCall) deny(err error) *rpcError {
	a.fail = err
	return rpcErr(rpcInternalError, "%s", err.Error())
}

func (a *a2aCall) ctx() context.Context { return a.c.Request().Context() }

func (a *a2aCall) decode(v any) *rpcError {
	if isNull(a.params) {
		return rpcErr(rpcInvalidParams, `"params" is required`)
	}
	if err := json.Unmarshal(a.params, v); err != nil {
		return rpcErr(rpcInvalidParams, "params: %s", describeJSONError(err, ""))
	}
	return nil
}

// toRPC maps a server error to a JSON-RPC error.
func (a *a2aCall) toRPC(err error) *rpcError {
	var re *rpcError
	if errors.As(err, &re) {
		return re
	}
	if errors.Is(err, log.ErrSubmissionNotFound) {
		return rpcErr(a2aTaskNotFound, "task not found")
	}
	e, internal := toAPIError(err)
	if internal {
		a.s.log.ErrorContext(a.ctx(), "a2a request failed", "agent", a.agent, "err", err)
		return rpcErr(rpcInternalError, "internal error")
	}
	if e.Status >= 500 {
		return rpcErr(rpcInternalError, "%s", e.Message)
	}
	return rpcErr(rpcInvalidParams, "%s", e.Message)
}

type sendParams struct {
	Message       *a2aMessage `json:"message"`
	Configuration struct {
		ReturnImmediately bool `json:"returnImmediately"`
		HistoryLength     *int `json:"historyLength"`
	} `json:"configuration"`
}

// admitMessage admits the params' message: its task, and whether the task
// is fresh (no frame of its turn can predate the returned cursor).
func (a *a2aCall) admitMessage() (record.Key, record.Submission, DeltaCursor, bool, bool, *rpcError) {
	var p sendParams
	if e := a.decode(&p); e != nil {
		return record.Key{}, record.Submission{}, nil, false, false, e
	}
	m := p.Message
	if m == nil {
		return record.Key{}, record.Submission{}, nil, false, false, rpcErr(rpcInvalidParams, `"message" is required`)
	}
	// Only a user's message is input: an agent's message sent as one would
	// be stored as the user's words.
	if m.Role != "ROLE_USER" && m.Role != "user" {
		return record.Key{}, record.Submission{}, nil, false, false, rpcErr(rpcInvalidParams, `message.role must be "ROLE_USER", not %q`, record.Clip(m.Role, 40))
	}
	if m.TaskID != "" {
		return record.Key{}, record.Submission{}, nil, false, false, rpcErr(a2aUnsupportedOperation,
			"a task here answers one message and takes no follow-up: send the next message with the same contextId and no taskId")
	}
	var payload record.MessagePayload
	for i, part := range m.Parts {
		var lp record.Part
		switch {
		case part.Text != nil:
			if *part.Text == "" {
				continue
			}
			lp = record.Part{Type: record.PartText, Text: *part.Text}
		case part.URL != "":
			lp = record.Part{Type: record.PartFile, MediaType: part.MediaType, URL: part.URL, Filename: part.Filename}
		case part.Raw != "":
			if _, err := base64.StdEncoding.DecodeString(part.Raw); err != nil {
				return record.Key{}, record.Submission{}, nil, false, false, rpcErr(rpcInvalidParams, "message.parts[%d].raw is not base64", i)
			}
			lp = record.Part{Type: record.PartFile, MediaType: part.MediaType, URL: "data:" + part.MediaType + ";base64," + part.Raw, Filename: part.Filename}
		case !isNull(part.Data):
			lp = record.Part{Type: record.PartData, Name: "data", Data: part.Data}
		default:
			continue
		}
		if err := validatePart(lp); err != nil {
			return record.Key{}, record.Submission{}, nil, false, false, rpcErr(rpcInvalidParams, "message.parts[%d]: %s", i, err)
		}
		payload.Parts = append(payload.Parts, lp)
	}
	if len(payload.Parts) == 0 {
		return record.Key{}, record.Submission{}, nil, false, false, rpcErr(rpcInvalidParams, "the message has no part this agent reads (text, url, raw or data)")
	}
	contextID := m.ContextID
	if contextID == "" {
		contextID = "ctx_" + ulid.Make().String()
	} else if err := record.ValidateName(contextID); err != nil {
		return record.Key{}, record.Submission{}, nil, false, false, rpcErr(rpcInvalidParams, "contextId: %s", err)
	}
	if m.MessageID != "" {
		payload.Metadata = compactJSON(map[string]string{"a2aMessageId": m.MessageID})
	}
	if err := a.s.allowConversation(a.c, a.agent, contextID, auth.VerbDeliver, auth.VerbRead); err != nil {
		return record.Key{}, record.Submission{}, nil, false, false, a.deny(err)
	}
	if err := a.s.drawDelivery(a.c); err != nil {
		return record.Key{}, record.Submission{}, nil, false, false, a.deny(err)
	}
	key := record.Key{Agent: a.agent, Instance: contextID, Session: record.DefaultSession}
	cur := a.s.followDeltas(a.ctx(), key)
	sub, replayed, err := a.s.admitMessage(a.c, adapterAdmission{key: key, payload: payload, idemScope: "a2a", idemID: m.MessageID})
	if err != nil {
		if cur != nil {
			cur.Close()
		}
		return key, sub, nil, false, false, a.toRPC(err)
	}
	fresh := true
	if replayed {
		if sub, err = a.s.db.Submission(a.ctx(), sub.ID); err != nil {
			if cur != nil {
				cur.Close()
			}
			return key, sub, nil, false, false, a.toRPC(err)
		}
		fresh = sub.Status == record.StatusAdmitted
	}
	return key, sub, cur, fresh, p.Configuration.ReturnImmediately, nil
}

// sendMessage is SendMessage: the task when it ended, or at once with
// configuration.returnImmediately.
func (a *a2aCall) sendMessage(bool) (any, *rpcError) {
	// A blocking send holds its connection for the whole turn, as a
	// stream does: it counts against the stream caps, before the
	// admission, so that a refused call admits nothing.
	var peek sendParams
	if e := a.decode(&peek); e != nil {
		return nil, e
	}
	history, e := historyLength(peek.Configuration.HistoryLength)
	if e != nil {
		return nil, e
	}
	if !peek.Configuration.ReturnImmediately {
		release, err := a.s.beginStream(a.c)
		if err != nil {
			return nil, a.deny(err)
		}
		defer release()
	}
	_, sub, cur, _, immediate, e := a.admitMessage()
	if e != nil {
		return nil, e
	}
	if cur != nil {
		cur.Close() // a blocking send reads the log only
	}
	if !immediate {
		if err := a.waitSettled(sub); err != nil {
			return nil, a.toRPC(err)
		}
	}
	t, err := a.s.taskOf(a.ctx(), sub.ID, history)
	if err != nil {
		return nil, a.toRPC(err)
	}
	return map[string]any{"task": t}, nil
}

// waitSettled waits until the submission settles, or the server stops (the
// task is then reported as it stands).
func (a *a2aCall) waitSettled(sub record.Submission) error {
	ctx := a.ctx()
	for {
		changed, release := a.s.db.Changed(sub.Key)
		cur, err := a.s.db.Submission(ctx, sub.ID)
		if err != nil || cur.Status.Terminal() {
			release()
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			release()
			return ctx.Err()
		case <-a.s.db.Done():
			release()
			return nil
		case <-a.s.closing:
			release()
			return nil
		}
		release()
	}
}

type idParams struct {
	ID            string `json:"id"`
	HistoryLength *int   `json:"historyLength"`
}

// submissionOf is the task id's submission, if it belongs to this agent
// and the caller may read its conversation: a task the caller may not read
// is as absent as one that never was.
func (a *a2aCall) submissionOf(id string) (record.Submission, *rpcError) {
	if id == "" {
		return record.Submission{}, rpcErr(rpcInvalidParams, `"id" (the task id) is required`)
	}
	if len(id) > record.MaxIDLength {
		return record.Submission{}, rpcErr(a2aTaskNotFound, "task not found")
	}
	sub, err := a.s.db.Submission(a.ctx(), id)
	if err != nil {
		return sub, a.toRPC(err)
	}
	if sub.Key.Agent != a.agent || !a.s.allows(a.c, sub.Key.Agent, sub.Key.Instance, auth.VerbRead) {
		return record.Submission{}, rpcErr(a2aTaskNotFound, "task not found")
	}
	return sub, nil
}

func (a *a2aCall) getTask() (any, *rpcError) {
	var p idParams
	if e := a.decode(&p); e != nil {
		return nil, e
	}
	if _, e := a.submissionOf(p.ID); e != nil {
		return nil, e
	}
	history, e := historyLength(p.HistoryLength)
	if e != nil {
		return nil, e
	}
	t, err := a.s.taskOf(a.ctx(), p.ID, history)
	if err != nil {
		return nil, a.toRPC(err)
	}
	return t, nil
}

func (a *a2aCall) cancelTask() (any, *rpcError) {
	var p idParams
	if e := a.decode(&p); e != nil {
		return nil, e
	}
	sub, e := a.submissionOf(p.ID)
	if e != nil {
		return nil, e
	}
	if err := a.s.allowConversation(a.c, sub.Key.Agent, sub.Key.Instance, auth.VerbAbort); err != nil {
		return nil, a.deny(err)
	}
	if _, err := a.s.opts.Conversations.Abort(a.ctx(), p.ID); err != nil {
		if errors.Is(err, log.ErrSubmissionSettled) {
			return nil, rpcErr(a2aTaskNotCancelable, "the task is already in a terminal state")
		}
		return nil, a.toRPC(err)
	}
	// An abort of a running turn settles when the turn stops: report the
	// task once it has.
	if err := a.waitSettled(sub); err != nil {
		return nil, a.toRPC(err)
	}
	t, err := a.s.taskOf(a.ctx(), p.ID, historyAll)
	if err != nil {
		return nil, a.toRPC(err)
	}
	return t, nil
}

type listParams struct {
	ContextID        string `json:"contextId"`
	Status           string `json:"status"`
	PageSize         int    `json:"pageSize"`
	PageToken        string `json:"pageToken"`
	IncludeArtifacts bool   `json:"includeArtifacts"`
	HistoryLength    *int   `json:"historyLength"`
}

// listTasks is ListTasks of one context: its submissions in the order of
// the log, newest first. Without a contextId there is no index to list
// from: the log is organised by conversation.
func (a *a2aCall) listTasks() (any, *rpcError) {
	var p listParams
	if !isNull(a.params) {
		if e := a.decode(&p); e != nil {
			return nil, e
		}
	}
	if p.ContextID == "" {
		return nil, rpcErr(rpcInvalidParams, `"contextId" is required: tasks are listed per context`)
	}
	if err := record.ValidateName(p.ContextID); err != nil {
		return nil, rpcErr(rpcInvalidParams, "contextId: %s", err)
	}
	if err := a.s.allowConversation(a.c, a.agent, p.ContextID, auth.VerbRead); err != nil {
		return nil, a.deny(err)
	}
	history, e := historyLength(p.HistoryLength)
	if e != nil {
		return nil, e
	}
	size := p.PageSize
	if size <= 0 || size > 100 {
		size = 50
	}
	skip := 0
	if p.PageToken != "" {
		n, err := strconv.Atoi(p.PageToken)
		if err != nil || n < 0 {
			return nil, rpcErr(rpcInvalidParams, "pageToken is not one this server issued")
		}
		skip = n
	}
	ctx := a.ctx()
	key := record.Key{Agent: a.agent, Instance: p.ContextID, Session: record.DefaultSession}
	var ids []string
	offset := record.Start
	for {
		page, err := a.s.db.Read(ctx, key, offset, log.MaxReadLimit)
		if err != nil {
			return nil, a.toRPC(err)
		}
		for _, b := range page.Batches {
			recs, err := b.Records.Decode()
			if err != nil {
				return nil, a.toRPC(err)
			}
			for _, r := range recs {
				if r.Kind == record.KindEntry && r.Entry.Type == record.EntryUserMessage && r.Entry.SubmissionID != "" {
					ids = append(ids, r.Entry.SubmissionID)
				}
			}
		}
		offset = page.NextOffset
		if page.UpToDate {
			break
		}
	}
	// Only the page's tasks are built from the log (each a read of its
	// turn); the others cost one lookup of their submission, for the
	// status filter, or nothing. Building every task of the context made
	// a call of 4,000 tasks take seconds for a page of one.
	filter := knownTaskState(p.Status)
	var page []string
	total := 0
	for i := len(ids) - 1; i >= 0; i-- {
		if filter {
			sub, err := a.s.db.Submission(ctx, ids[i])
			if err != nil {
				return nil, a.toRPC(err)
			}
			if taskState(sub.Status) != p.Status {
				continue
			}
		}
		total++
		if total > skip && len(page) < size {
			page = append(page, ids[i])
		}
	}
	tasks := []a2aTask{}
	for _, id := range page {
		t, err := a.s.taskOf(ctx, id, history)
		if err != nil {
			return nil, a.toRPC(err)
		}
		if !p.IncludeArtifacts {
			t.Artifacts = nil
		}
		tasks = append(tasks, t)
	}
	res := map[string]any{"tasks": tasks, "pageSize": size, "totalSize": total, "nextPageToken": ""}
	if skip+len(tasks) < total {
		res["nextPageToken"] = strconv.Itoa(skip + len(tasks))
	}
	return res, nil
}

// knownTaskState reports whether a status filter names a state. Clients
// send "TASK_STATE_UNSPECIFIED" (or, from the JS SDK, "UNRECOGNIZED") for
// no filter.
func knownTaskState(s string) bool {
	switch s {
	case taskSubmitted, taskWorking, taskCompleted, taskFailed, taskCanceled,
		"TASK_STATE_INPUT_REQUIRED", "TASK_STATE_REJECTED", "TASK_STATE_AUTH_REQUIRED":
		return true
	}
	return false
}

// taskState maps a submission status to the task state.
func taskState(st record.Status) string {
	switch st {
	case record.StatusRunning:
		return taskWorking
	case record.StatusCompleted:
		return taskCompleted
	case record.StatusFailed:
		return taskFailed
	case record.StatusAborted:
		return taskCanceled
	case record.StatusInputRequired:
		return taskInputRequired
	}
	return taskSubmitted
}

func statusTime(sub record.Submission) time.Time {
	switch {
	case !sub.SettledAt.IsZero():
		return sub.SettledAt
	case !sub.StartedAt.IsZero():
		return sub.StartedAt
	}
	return sub.AdmittedAt
}

func taskStatus(sub record.Submission) a2aStatus {
	st := a2aStatus{State: taskState(sub.Status), Timestamp: statusTime(sub).UTC().Format(time.RFC3339Nano)}
	if sub.Status == record.StatusFailed || sub.Status == record.StatusAborted {
		st.Message = &a2aMessage{MessageID: sub.ID + ".status", ContextID: sub.Key.Instance, TaskID: sub.ID, Role: "ROLE_AGENT",
			Parts: []a2aPart{textPart(failureText(sub.Error, record.Outcome(sub.Status)))}}
	}
	if sub.Waiting() {
		st.Message = approvalMessage(sub, sub.Pending)
	}
	return st
}

// historyAll asks taskOf for the whole history (A2A: historyLength absent).
const historyAll = -1

// historyLength is A2A's historyLength: absent is the whole history (no
// client limit), 0 none, n the last n messages.
func historyLength(n *int) (int, *rpcError) {
	switch {
	case n == nil:
		return historyAll, nil
	case *n < 0:
		return 0, rpcErr(rpcInvalidParams, "historyLength must not be negative")
	}
	return *n, nil
}

// taskOf builds the task from the log: the submission's status, the
// answer's text recorded so far and the last history messages of its
// history (historyAll for all).
func (s *Server) taskOf(ctx context.Context, id string, history int) (a2aTask, error) {
	sub, err := s.db.Submission(ctx, id)
	if err != nil {
		return a2aTask{}, err
	}
	sink := &textSink{}
	v := s.turnView(sub.Key, sub, nil, false, sink)
	if err := v.Snapshot(ctx); err != nil && !errors.Is(err, turnview.ErrReset) {
		return a2aTask{}, err
	}
	if v.Settled() {
		// The status may have been read before the settlement the view saw.
		if sub, err = s.db.Submission(ctx, id); err != nil {
			return a2aTask{}, err
		}
	}
	t := a2aTask{ID: sub.ID, ContextID: sub.Key.Instance, Status: taskStatus(sub)}
	if sink.text.Len() > 0 {
		t.Artifacts = []a2aArtifact{{ArtifactID: a2aArtifactID, Name: a2aArtifactID, Parts: []a2aPart{textPart(sink.text.String())}}}
	}
	if history != 0 {
		user, err := s.userMessage(ctx, sub)
		if err != nil {
			return a2aTask{}, err
		}
		if user != nil {
			t.History = append(t.History, *user)
		}
		if sink.text.Len() > 0 {
			t.History = append(t.History, a2aMessage{MessageID: sub.ID + ".answer", ContextID: sub.Key.Instance, TaskID: sub.ID,
				Role: "ROLE_AGENT", Parts: []a2aPart{textPart(sink.text.String())}})
		}
		if history > 0 && len(t.History) > history {
			t.History = t.History[len(t.History)-history:]
		}
	}
	return t, nil
}

// userMessage is the submission's user message as A2A's, from the batch
// at its offset; nil if the log no longer holds it (rewound, reset).
func (s *Server) userMessage(ctx context.Context, sub record.Submission) (*a2aMessage, error) {
	page, err := s.db.Read(ctx, sub.Key, sub.Offset, 1)
	if errors.Is(err, log.ErrUnknownOffset) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, b := range page.Batches {
		recs, err := b.Records.Decode()
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			if r.Kind != record.KindEntry || r.Entry == nil || r.Entry.Type != record.EntryUserMessage || r.Entry.SubmissionID != sub.ID {
				continue
			}
			var p record.MessagePayload
			if err := json.Unmarshal(r.Entry.Payload, &p); err != nil {
				return nil, fmt.Errorf("the user message of %s: %w", sub.ID, err)
			}
			m := a2aMessage{MessageID: sub.ID + ".input", ContextID: sub.Key.Instance, TaskID: sub.ID, Role: "ROLE_USER"}
			var meta struct {
				ID string `json:"a2aMessageId"`
			}
			if len(p.Metadata) > 0 && json.Unmarshal(p.Metadata, &meta) == nil && meta.ID != "" {
				m.MessageID = meta.ID
			}
			for _, lp := range p.Parts {
				switch lp.Type {
				case record.PartText:
					m.Parts = append(m.Parts, textPart(lp.Text))
				case record.PartFile:
					m.Parts = append(m.Parts, a2aPart{URL: lp.URL, MediaType: lp.MediaType, Filename: lp.Filename})
				case record.PartData:
					m.Parts = append(m.Parts, a2aPart{Data: lp.Data})
				}
			}
			if m.Parts == nil {
				m.Parts = []a2aPart{}
			}
			return &m, nil
		}
	}
	return nil, nil
}

// textSink collects the answer's text.
type textSink struct{ text strings.Builder }

func (k *textSink) Emit(ev turnview.Event) {
	if ev.Op == turnview.OpPartDelta && ev.Kind == turnview.KindText {
		k.text.WriteString(ev.Delta)
	}
}
func (k *textSink) Keepalive()   {}
func (k *textSink) Flush() error { return nil }

// sendStreaming is SendStreamingMessage: the task, then its updates as SSE.
func (a *a2aCall) sendStreaming() *rpcError {
	// The stream cap first: a refused stream must not admit the message.
	release, err := a.s.beginStream(a.c)
	if err != nil {
		return a.deny(err)
	}
	defer release()
	key, sub, cur, fresh, _, e := a.admitMessage()
	if e != nil {
		return e
	}
	if cur != nil {
		defer cur.Close()
	}
	return a.stream(key, sub, cur, fresh)
}

// subscribe is SubscribeToTask: the task's current state, then its answer
// replayed from the log and followed live until it ends. A task that has
// already ended is replayed whole.
func (a *a2aCall) subscribe() *rpcError {
	var p idParams
	if e := a.decode(&p); e != nil {
		return e
	}
	sub, e := a.submissionOf(p.ID)
	if e != nil {
		return e
	}
	release, err := a.s.beginStream(a.c)
	if err != nil {
		return a.deny(err)
	}
	defer release()
	cur, sub, fresh, err := a.s.viewCursor(a.ctx(), sub.Key, sub.ID)
	if err != nil {
		return a.toRPC(err)
	}
	if cur != nil {
		defer cur.Close()
	}
	return a.stream(sub.Key, sub, cur, fresh)
}

func (a *a2aCall) stream(key record.Key, sub record.Submission, cur DeltaCursor, fresh bool) *rpcError {
	a.streamed = true
	s := a.s
	w := s.openSSE(a.c, map[string]string{a2aVersionHeader: a2aVersion})
	defer w.release()
	sink := &a2aSink{w: w, id: a.id, sub: sub}
	err := s.turnView(key, sub, cur, fresh, sink).Run(a.ctx())
	switch {
	case err == nil, errors.Is(err, turnview.ErrStopped):
	default:
		if !errors.Is(err, turnview.ErrReset) {
			s.log.ErrorContext(a.ctx(), "a2a stream", "key", key.String(), "err", err)
		}
		sink.send(rpcResponse{JSONRPC: "2.0", ID: a.id, Error: rpcErr(rpcInternalError, "%s", err.Error())})
	}
	_ = w.flush()
	return nil
}

// a2aSink encodes view events as A2A stream responses.
type a2aSink struct {
	w        *sseWriter
	id       json.RawMessage
	sub      record.Submission
	working  bool // a working status was sent
	appended bool // the output artifact has a first chunk
}

func (k *a2aSink) send(r rpcResponse) {
	if len(r.ID) == 0 {
		r.ID = json.RawMessage("null")
	}
	k.w.event("", compactJSON(r))
}

func (k *a2aSink) result(sr a2aStreamResponse) {
	k.send(rpcResponse{JSONRPC: "2.0", ID: k.id, Result: sr})
}

func (k *a2aSink) status(state string, sub record.Submission) {
	st := taskStatus(sub)
	st.State = state
	k.result(a2aStreamResponse{StatusUpdate: &a2aStatusUpdate{TaskID: k.sub.ID, ContextID: k.sub.Key.Instance, Status: st}})
}

func (k *a2aSink) Emit(ev turnview.Event) {
	switch ev.Op {
	case turnview.OpStart:
		// The first event is the task as it stands, without its answer:
		// the updates that follow carry the answer from its start.
		t := a2aTask{ID: k.sub.ID, ContextID: k.sub.Key.Instance, Status: taskStatus(k.sub)}
		if k.sub.Status.Terminal() {
			t.Status = a2aStatus{State: taskWorking, Timestamp: t.Status.Timestamp}
		}
		k.working = t.Status.State == taskWorking
		k.result(a2aStreamResponse{Task: &t})
	case turnview.OpPartDelta:
		if ev.Kind != turnview.KindText || ev.Delta == "" {
			return
		}
		if !k.working {
			k.working = true
			k.status(taskWorking, k.sub)
		}
		k.result(a2aStreamResponse{ArtifactUpdate: &a2aArtifactUpdate{TaskID: k.sub.ID, ContextID: k.sub.Key.Instance,
			Artifact: a2aArtifact{ArtifactID: a2aArtifactID, Name: a2aArtifactID, Parts: []a2aPart{textPart(ev.Delta)}},
			Append:   k.appended}})
		k.appended = true
	case turnview.OpFinish:
		if k.appended {
			k.result(a2aStreamResponse{ArtifactUpdate: &a2aArtifactUpdate{TaskID: k.sub.ID, ContextID: k.sub.Key.Instance,
				Artifact: a2aArtifact{ArtifactID: a2aArtifactID, Name: a2aArtifactID, Parts: []a2aPart{textPart("")}},
				Append:   true, LastChunk: true}})
		}
		sub := k.sub
		sub.Status = record.Status(ev.Outcome) // the outcomes are the terminal statuses
		sub.Error = ev.Failure
		sub.SettledAt = time.Now()
		k.status(taskState(sub.Status), sub)
	case turnview.OpInputRequired:
		st := taskStatus(ev.Sub)
		st.State = taskInputRequired
		st.Message = approvalMessage(ev.Sub, ev.Requests)
		k.result(a2aStreamResponse{StatusUpdate: &a2aStatusUpdate{TaskID: k.sub.ID, ContextID: k.sub.Key.Instance, Status: st}})
	}
}

// approvalMessage is the status message of a task waiting for approvals:
// one data part {"requests": [...]}, the submission's pending requests.
func approvalMessage(sub record.Submission, reqs []record.ApprovalRequest) *a2aMessage {
	data, _ := json.Marshal(record.ApprovalRequestPayload{Requests: reqs})
	return &a2aMessage{MessageID: sub.ID + ".status", ContextID: sub.Key.Instance, TaskID: sub.ID, Role: "ROLE_AGENT",
		Parts: []a2aPart{{Data: data}}}
}

func (k *a2aSink) Keepalive()   { k.w.comment("keepalive") }
func (k *a2aSink) Flush() error { return k.w.flush() }
