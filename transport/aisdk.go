package transport

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/internal/conversation/turnview"
	"github.com/convlog/convlog/log"
	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// The Vercel AI SDK adapter: a useChat endpoint speaking the UI message
// stream protocol v1.
//
//	POST /ai-sdk/:agent                  {id, messages, trigger, messageId} -> UI message stream
//	GET  /ai-sdk/:agent/:chatId/stream   resume: 200 and the active answer from its start, or 204
//
// The chat id is the instance (session "default"). Only the last message is
// read: the log holds the conversation. Its UI message id makes the send
// idempotent: a retried send gets the first send's answer, replayed from
// the log, instead of a second turn.

// aiSDKStreamHeader marks a UI message stream for the SDK.
const aiSDKStreamHeader = "x-vercel-ai-ui-message-stream"

type aiChatRequest struct {
	ID        string      `json:"id"`
	Messages  []aiMessage `json:"messages"`
	Trigger   string      `json:"trigger"`
	MessageID string      `json:"messageId"`
}

type aiMessage struct {
	ID    string   `json:"id"`
	Role  string   `json:"role"`
	Parts []aiPart `json:"parts"`
}

type aiPart struct {
	Type      string `json:"type"`
	Text      string `json:"text"`
	MediaType string `json:"mediaType"`
	URL       string `json:"url"`
	Filename  string `json:"filename"`
}

// errRegenerate is decodeAIChat's answer to a regenerate-message trigger:
// not a message to admit but a rewind (aiSDKRegenerate).
var errRegenerate = errors.New("regenerate")

// decodeAIChat reads a useChat request: the chat id and the payload of its
// last (user) message.
func decodeAIChat(body []byte) (chatID, msgID string, p record.MessagePayload, err error) {
	var req aiChatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return "", "", p, badRequest("%s", describeJSONError(err, ""))
	}
	if req.ID == "" {
		return "", "", p, badRequest(`"id" (the chat id) is required`)
	}
	if err := validInstance("chat id", req.ID); err != nil {
		return "", "", p, err
	}
	switch req.Trigger {
	case "", "submit-message":
	case "regenerate-message":
		if err := validInstance("chat id", req.ID); err != nil {
			return "", "", p, err
		}
		return req.ID, req.MessageID, p, errRegenerate
	default:
		return "", "", p, badRequest(`"trigger" must be "submit-message", not %q`, record.Clip(req.Trigger, 40))
	}
	if len(req.Messages) == 0 {
		return "", "", p, badRequest(`"messages" is empty`)
	}
	last := req.Messages[len(req.Messages)-1]
	if last.Role != "user" {
		return "", "", p, badRequest(`the last message must be the user's, not %q`, record.Clip(last.Role, 40))
	}
	for i, part := range last.Parts {
		var lp record.Part
		switch part.Type {
		case "text":
			if part.Text == "" {
				continue
			}
			lp = record.Part{Type: record.PartText, Text: part.Text}
		case "file":
			lp = record.Part{Type: record.PartFile, MediaType: part.MediaType, URL: part.URL, Filename: part.Filename}
		default:
			continue // UI-only parts (step-start, sources, data-*) are not input
		}
		if err := validatePart(lp); err != nil {
			return "", "", p, badRequest(`"messages[%d].parts[%d]": %s`, len(req.Messages)-1, i, err)
		}
		p.Parts = append(p.Parts, lp)
	}
	if len(p.Parts) == 0 {
		return "", "", p, badRequest("the last message has no text or file part")
	}
	if last.ID != "" {
		p.Metadata = compactJSON(map[string]string{"uiMessageId": last.ID})
	}
	return req.ID, last.ID, p, nil
}

// aiSDKChat is POST /ai-sdk/:agent.
func (s *Server) aiSDKChat(c echo.Context) error {
	agent, body, release, err := s.adapterRequest(c)
	if err != nil {
		return err
	}
	defer release()
	chatID, msgID, payload, err := decodeAIChat(body)
	if errors.Is(err, errRegenerate) {
		return s.aiSDKRegenerate(c, agent, chatID, msgID)
	}
	if err != nil {
		return err
	}
	if err := s.allowConversation(c, agent, chatID, auth.VerbDeliver, auth.VerbRead); err != nil {
		return err
	}
	err = s.agentExists(agent)
	if err != nil {
		return err
	}
	// The stream caps before the admission: a refused stream must not
	// admit the message.
	endStream, err := s.beginStream(c)
	if err != nil {
		return err
	}
	defer endStream()
	ctx := c.Request().Context()
	key := record.Key{Agent: agent, Instance: chatID, Session: record.DefaultSession}
	// The cursor before the admission: every frame of the new turn is seen.
	cur := s.followDeltas(ctx, key)
	if cur != nil {
		defer cur.Close()
	}
	sub, replayed, err := s.admitMessage(c, adapterAdmission{key: key, payload: payload, idemScope: "ai-sdk", idemID: msgID})
	if err != nil {
		return err
	}
	release() // admitted: the answer may stream for a whole turn
	fresh := true
	if replayed {
		if sub, err = s.db.Submission(ctx, sub.ID); err != nil {
			return err
		}
		fresh = sub.Status == record.StatusAdmitted
	}
	return s.aiSDKServe(c, key, sub, cur, fresh)
}

// aiSDKResume is GET /ai-sdk/:agent/:chatId/stream: the answer of the
// chat's latest unsettled submission, from its start, or 204.
func (s *Server) aiSDKResume(c echo.Context) error {
	agent, err := adapterAgentName(c)
	if err != nil {
		return err
	}
	chatID := pathParam(c, "chatId")
	if err := validInstance("chat id", chatID); err != nil {
		return err
	}
	if err := s.allowConversation(c, agent, chatID, auth.VerbRead); err != nil {
		return err
	}
	if err := s.agentExists(agent); err != nil {
		return err
	}
	ctx := c.Request().Context()
	key := record.Key{Agent: agent, Instance: chatID, Session: record.DefaultSession}
	pending, err := s.db.Pending(ctx, key)
	if err != nil {
		return err
	}
	if len(pending) == 0 {
		return c.NoContent(http.StatusNoContent)
	}
	endStream, err := s.beginStream(c)
	if err != nil {
		return err
	}
	defer endStream()
	cur, sub, fresh, err := s.viewCursor(ctx, key, pending[len(pending)-1].ID)
	if err != nil {
		return err
	}
	if cur != nil {
		defer cur.Close()
	}
	return s.aiSDKServe(c, key, sub, cur, fresh)
}

// aiSDKRegenerate answers a regenerate-message trigger: the conversation
// rewinds to before its last user message, which is delivered again (as
// POST …/regenerate does), and the new answer streams. The assistant
// message id the SDK names makes a retry idempotent.
func (s *Server) aiSDKRegenerate(c echo.Context, agent, chatID, msgID string) error {
	if s.stopAd.Load() {
		return apiErr(http.StatusServiceUnavailable, wire.CodeShuttingDown, "the server is shutting down and changes nothing")
	}
	// Regenerating rewinds the conversation: manage, as on the native route.
	if err := s.allowConversation(c, agent, chatID, auth.VerbManage, auth.VerbRead); err != nil {
		return err
	}
	if err := s.agentExists(agent); err != nil {
		return err
	}
	endStream, err := s.beginStream(c)
	if err != nil {
		return err
	}
	defer endStream()
	ctx := c.Request().Context()
	key := record.Key{Agent: agent, Instance: chatID, Session: record.DefaultSession}
	ch := log.Change{Kind: log.ChangeRegenerate, Key: key}
	p, authed := PrincipalOf(c)
	if authed {
		who, err := json.Marshal(p)
		if err != nil {
			return err
		}
		ch.Metadata = map[string]json.RawMessage{MetadataPrincipal: who}
	}
	if msgID != "" {
		h := sha256.Sum256([]byte("ai-sdk-regenerate\x00" + key.String() + "\x00" + msgID))
		ch.IdempotencyKey = "ai-sdk-regenerate:" + hex.EncodeToString(h[:])
		ch.RequestHash = requestHash(agent, chatID, p.Issuer+"\x00"+p.Subject, []byte(msgID))
	}
	cur := s.followDeltas(ctx, key)
	if cur != nil {
		defer cur.Close()
	}
	res, replayed, err := s.opts.Conversations.Change(ctx, ch)
	if err != nil {
		return err
	}
	if res.Submission == nil {
		return errors.New("regenerate: no submission in the result")
	}
	sub := *res.Submission
	fresh := true
	if replayed {
		if sub, err = s.db.Submission(ctx, sub.ID); err != nil {
			return err
		}
		fresh = sub.Status == record.StatusAdmitted
	}
	return s.aiSDKServe(c, key, sub, cur, fresh)
}

func (s *Server) aiSDKServe(c echo.Context, key record.Key, sub record.Submission, cur DeltaCursor, fresh bool) error {
	w := s.openSSE(c, map[string]string{aiSDKStreamHeader: "v1"})
	defer w.release()
	sink := &aiSDKSink{w: w}
	err := s.turnView(key, sub, cur, fresh, sink).Run(c.Request().Context())
	switch {
	case err == nil:
	case errors.Is(err, turnview.ErrStopped):
		return nil // cut: the client resumes
	default:
		if !errors.Is(err, turnview.ErrReset) {
			s.log.ErrorContext(c.Request().Context(), "ai-sdk stream", "key", key.String(), "err", err)
		}
		sink.chunk(aiError{Type: "error", ErrorText: err.Error()})
	}
	if sink.finished || err != nil {
		w.event("", []byte("[DONE]"))
	}
	_ = w.flush()
	return nil
}

// aiSDKSink encodes view events as UI message stream chunks.
type aiSDKSink struct {
	w        *sseWriter
	finished bool
}

func (k *aiSDKSink) chunk(v any) { k.w.event("", compactJSON(v)) }

// Chunk bodies are ordered structs, so that the bytes are stable.
type (
	aiStart struct {
		Type            string     `json:"type"`
		MessageID       string     `json:"messageId"`
		MessageMetadata aiMetadata `json:"messageMetadata"`
	}
	aiMetadata struct {
		SubmissionID string `json:"submissionId"`
	}
	aiPartChunk struct {
		Type  string  `json:"type"`
		ID    string  `json:"id"`
		Delta *string `json:"delta,omitempty"`
	}
	aiTool struct {
		Type           string          `json:"type"`
		ToolCallID     string          `json:"toolCallId"`
		ToolName       string          `json:"toolName,omitempty"`
		InputTextDelta *string         `json:"inputTextDelta,omitempty"`
		Input          json.RawMessage `json:"input,omitempty"`
		Output         json.RawMessage `json:"output,omitempty"`
		ErrorText      string          `json:"errorText,omitempty"`
		// The agent ran the tool on the server: the client has nothing to
		// execute.
		ProviderExecuted bool `json:"providerExecuted,omitempty"`
	}
	aiError struct {
		Type      string `json:"type"`
		ErrorText string `json:"errorText"`
	}
	aiAbort struct {
		Type   string `json:"type"`
		Reason string `json:"reason"`
	}
	aiFinish struct {
		Type            string     `json:"type"`
		FinishReason    string     `json:"finishReason"`
		MessageMetadata aiMetadata `json:"messageMetadata"`
	}
)

func (k *aiSDKSink) Emit(ev turnview.Event) {
	prefix := "text"
	if ev.Kind == turnview.KindReasoning {
		prefix = "reasoning"
	}
	switch ev.Op {
	case turnview.OpStart:
		k.chunk(aiStart{Type: "start", MessageID: ev.Sub.ID, MessageMetadata: aiMetadata{ev.Sub.ID}})
		k.chunk(map[string]string{"type": "start-step"})
	case turnview.OpPartStart:
		k.chunk(aiPartChunk{Type: prefix + "-start", ID: ev.ID})
	case turnview.OpPartDelta:
		d := ev.Delta
		k.chunk(aiPartChunk{Type: prefix + "-delta", ID: ev.ID, Delta: &d})
	case turnview.OpPartEnd:
		k.chunk(aiPartChunk{Type: prefix + "-end", ID: ev.ID})
	case turnview.OpToolCall:
		input := string(rawOrNull(ev.Input))
		k.chunk(aiTool{Type: "tool-input-start", ToolCallID: ev.ID, ToolName: ev.ToolName, ProviderExecuted: true})
		k.chunk(aiTool{Type: "tool-input-delta", ToolCallID: ev.ID, InputTextDelta: &input})
		k.chunk(aiTool{Type: "tool-input-available", ToolCallID: ev.ID, ToolName: ev.ToolName, Input: rawOrNull(ev.Input), ProviderExecuted: true})
	case turnview.OpToolResult:
		if ev.IsError {
			k.chunk(aiTool{Type: "tool-output-error", ToolCallID: ev.ID, ErrorText: string(rawOrNull(ev.Output)), ProviderExecuted: true})
		} else {
			k.chunk(aiTool{Type: "tool-output-available", ToolCallID: ev.ID, Output: rawOrNull(ev.Output), ProviderExecuted: true})
		}
	case turnview.OpFinish:
		k.chunk(map[string]string{"type": "finish-step"})
		reason := "stop"
		switch ev.Outcome {
		case record.OutcomeFailed:
			reason = "error"
			k.chunk(aiError{Type: "error", ErrorText: failureText(ev.Failure, ev.Outcome)})
		case record.OutcomeAborted:
			reason = "other"
			k.chunk(aiAbort{Type: "abort", Reason: failureText(ev.Failure, ev.Outcome)})
		}
		k.chunk(aiFinish{Type: "finish", FinishReason: reason, MessageMetadata: aiMetadata{ev.Sub.ID}})
		k.finished = true
	case turnview.OpInputRequired:
		// The message stops at the calls a person must approve; the answer
		// continues it once they are decided.
		for _, r := range ev.Requests {
			k.chunk(map[string]string{"type": "tool-approval-request", "approvalId": r.ApprovalID, "toolCallId": r.ToolCallID})
		}
		k.chunk(map[string]string{"type": "finish-step"})
		k.chunk(aiFinish{Type: "finish", FinishReason: "tool-calls", MessageMetadata: aiMetadata{ev.Sub.ID}})
		k.finished = true
	}
}

func (k *aiSDKSink) Keepalive()   { k.w.comment("keepalive") }
func (k *aiSDKSink) Flush() error { return k.w.flush() }
