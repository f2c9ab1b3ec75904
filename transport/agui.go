package transport

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/internal/conversation/turnview"
	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/log/record"
)

// The AG-UI adapter: POST /ag-ui/:agent takes a RunAgentInput and answers
// the run's events as SSE. The thread id is the instance (session
// "default"), the last user message is the input (the log holds the rest),
// its id makes the run idempotent, and the run id is echoed.

type aguiInput struct {
	ThreadID string        `json:"threadId"`
	RunID    string        `json:"runId"`
	Messages []aguiMessage `json:"messages"`
}

type aguiMessage struct {
	ID      string          `json:"id"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type aguiContent struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	MimeType string `json:"mimeType"`
	URL      string `json:"url"`
	Data     string `json:"data"`
	Filename string `json:"filename"`
}

func decodeAGUI(body []byte) (in aguiInput, msgID string, p record.MessagePayload, err error) {
	if err := json.Unmarshal(body, &in); err != nil {
		return in, "", p, badRequest("%s", describeJSONError(err, ""))
	}
	if in.ThreadID == "" || in.RunID == "" {
		return in, "", p, badRequest(`"threadId" and "runId" are required`)
	}
	if err := validInstance("threadId", in.ThreadID); err != nil {
		return in, "", p, err
	}
	if len(in.Messages) == 0 {
		return in, "", p, badRequest(`"messages" is empty: the last one must be the user's input`)
	}
	last := in.Messages[len(in.Messages)-1]
	if last.Role != "user" {
		return in, "", p, badRequest(`the last message must be the user's, not %q`, record.Clip(last.Role, 40))
	}
	var text string
	if len(last.Content) > 0 && last.Content[0] == '"' {
		if err := json.Unmarshal(last.Content, &text); err != nil {
			return in, "", p, badRequest(`"content": %s`, describeJSONError(err, ""))
		}
		if strings.TrimSpace(text) != "" {
			p.Parts = append(p.Parts, record.Part{Type: record.PartText, Text: text})
		}
	} else if !isNull(last.Content) {
		var parts []aguiContent
		if err := json.Unmarshal(last.Content, &parts); err != nil {
			return in, "", p, badRequest(`"content" must be a string or an array of parts`)
		}
		for _, c := range parts {
			var lp record.Part
			switch {
			case c.Type == "text" && c.Text != "":
				lp = record.Part{Type: record.PartText, Text: c.Text}
			case c.Type == "binary" && c.MimeType != "" && (c.URL != "" || c.Data != ""):
				u := c.URL
				if u == "" {
					// Refused as A2A refuses its raw parts: a data URL
					// that does not decode is no file for the agent.
					if _, err := base64.StdEncoding.DecodeString(c.Data); err != nil {
						return in, "", p, badRequest(`the last message: a "binary" part's "data" is not base64`)
					}
					u = "data:" + c.MimeType + ";base64," + c.Data
				}
				lp = record.Part{Type: record.PartFile, MediaType: c.MimeType, URL: u, Filename: c.Filename}
			default:
				continue
			}
			if err := validatePart(lp); err != nil {
				return in, "", p, badRequest(`the last message: %s`, err)
			}
			p.Parts = append(p.Parts, lp)
		}
	}
	if len(p.Parts) == 0 {
		return in, "", p, badRequest("the last message has no text")
	}
	if last.ID != "" {
		// Not the run id: the stored payload is what the idempotency
		// compares, and a retry of a run may mint a new run id for the
		// same message.
		p.Metadata = compactJSON(map[string]string{"agUiMessageId": last.ID})
	}
	return in, last.ID, p, nil
}

// agUIRun is POST /ag-ui/:agent.
func (s *Server) agUIRun(c echo.Context) error {
	agent, body, release, err := s.adapterRequest(c)
	if err != nil {
		return err
	}
	defer release()
	in, msgID, payload, err := decodeAGUI(body)
	if err != nil {
		return err
	}
	if err := s.allowConversation(c, agent, in.ThreadID, auth.VerbDeliver, auth.VerbRead); err != nil {
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
	key := record.Key{Agent: agent, Instance: in.ThreadID, Session: record.DefaultSession}
	cur := s.followDeltas(ctx, key)
	if cur != nil {
		defer cur.Close()
	}
	// The run id is not part of the idempotency: a client retrying a run
	// may well mint a new one for the same message.
	sub, replayed, err := s.admitMessage(c, adapterAdmission{key: key, payload: payload, idemScope: "ag-ui", idemID: msgID})
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
	w := s.openSSE(c, nil)
	defer w.release()
	sink := &aguiSink{w: w, threadID: in.ThreadID, runID: in.RunID}
	err = s.turnView(key, sub, cur, fresh, sink).Run(ctx)
	switch {
	case err == nil, errors.Is(err, turnview.ErrStopped):
	default:
		if !errors.Is(err, turnview.ErrReset) {
			s.log.ErrorContext(ctx, "ag-ui stream", "key", key.String(), "err", err)
		}
		sink.closeOpen()
		sink.event(aguiEvent{Type: "RUN_ERROR", Message: err.Error(), Code: "stream_failed"})
	}
	_ = w.flush()
	return nil
}

// aguiEvent is every event the adapter sends; the fields of its type are
// set, the others are empty and omitted.
type aguiEvent struct {
	Type         string          `json:"type"`
	ThreadID     string          `json:"threadId,omitempty"`
	RunID        string          `json:"runId,omitempty"`
	MessageID    string          `json:"messageId,omitempty"`
	Role         string          `json:"role,omitempty"`
	Delta        string          `json:"delta,omitempty"`
	ToolCallID   string          `json:"toolCallId,omitempty"`
	ToolCallName string          `json:"toolCallName,omitempty"`
	ParentMsgID  string          `json:"parentMessageId,omitempty"`
	Content      *string         `json:"content,omitempty"`
	Outcome      json.RawMessage `json:"outcome,omitempty"`
	Message      string          `json:"message,omitempty"`
	Code         string          `json:"code,omitempty"`
}

type aguiSink struct {
	w               *sseWriter
	threadID, runID string
	subID           string
	open            map[string]string // message id -> kind, of open messages
	lastText        string            // the run's latest assistant text message

}

func (k *aguiSink) event(e aguiEvent) { k.w.event("", compactJSON(e)) }

// msgID makes a part id unique in the thread: one run's parts are named
// after its submission.
func (k *aguiSink) msgID(id string) string { return k.subID + "." + id }

func (k *aguiSink) Emit(ev turnview.Event) {
	switch ev.Op {
	case turnview.OpStart:
		k.subID = ev.Sub.ID
		k.open = map[string]string{}
		k.event(aguiEvent{Type: "RUN_STARTED", ThreadID: k.threadID, RunID: k.runID})
	case turnview.OpPartStart:
		id := k.msgID(ev.ID)
		k.open[id] = ev.Kind
		if ev.Kind == turnview.KindReasoning {
			k.event(aguiEvent{Type: "REASONING_START", MessageID: id})
			k.event(aguiEvent{Type: "REASONING_MESSAGE_START", MessageID: id, Role: "reasoning"})
		} else {
			k.lastText = id
			k.event(aguiEvent{Type: "TEXT_MESSAGE_START", MessageID: id, Role: "assistant"})
		}
	case turnview.OpPartDelta:
		if ev.Delta == "" {
			return
		}
		t := "TEXT_MESSAGE_CONTENT"
		if ev.Kind == turnview.KindReasoning {
			t = "REASONING_MESSAGE_CONTENT"
		}
		k.event(aguiEvent{Type: t, MessageID: k.msgID(ev.ID), Delta: ev.Delta})
	case turnview.OpPartEnd:
		k.end(k.msgID(ev.ID), ev.Kind)
	case turnview.OpToolCall:
		// The call belongs to the text before it: one assistant message
		// with its tool calls, as the client builds it.
		k.event(aguiEvent{Type: "TOOL_CALL_START", ToolCallID: ev.ID, ToolCallName: ev.ToolName, ParentMsgID: k.lastText})
		k.event(aguiEvent{Type: "TOOL_CALL_ARGS", ToolCallID: ev.ID, Delta: string(rawOrNull(ev.Input))})
		k.event(aguiEvent{Type: "TOOL_CALL_END", ToolCallID: ev.ID})
	case turnview.OpToolResult:
		content := toolResultText(ev.Output)
		k.event(aguiEvent{Type: "TOOL_CALL_RESULT", MessageID: k.subID + ".result." + ev.ID, ToolCallID: ev.ID, Content: &content, Role: "tool"})
	case turnview.OpFinish:
		k.closeOpen()
		switch ev.Outcome {
		case record.OutcomeCompleted:
			k.event(aguiEvent{Type: "RUN_FINISHED", ThreadID: k.threadID, RunID: k.runID})
		case record.OutcomeAborted:
			k.event(aguiEvent{Type: "RUN_FINISHED", ThreadID: k.threadID, RunID: k.runID, Outcome: json.RawMessage(`{"type":"cancelled"}`)})
		default:
			code := "failed"
			if ev.Failure != nil && ev.Failure.Code != "" {
				code = ev.Failure.Code
			}
			msg := "the run failed"
			if ev.Failure != nil && ev.Failure.Message != "" {
				msg = ev.Failure.Message
			}
			k.event(aguiEvent{Type: "RUN_ERROR", Message: msg, Code: code})
		}
	case turnview.OpInputRequired:
		// The run ends interrupted: one interrupt per pending approval; the
		// next run's resume decides them.
		k.closeOpen()
		type interrupt struct {
			ID         string `json:"id"`
			Reason     string `json:"reason"`
			ToolCallID string `json:"toolCallId"`
		}
		out := struct {
			Type       string      `json:"type"`
			Interrupts []interrupt `json:"interrupts"`
		}{Type: "interrupt", Interrupts: []interrupt{}}
		for _, r := range ev.Requests {
			out.Interrupts = append(out.Interrupts, interrupt{ID: r.ApprovalID, Reason: "tool_call", ToolCallID: r.ToolCallID})
		}
		b, _ := json.Marshal(out)
		k.event(aguiEvent{Type: "RUN_FINISHED", ThreadID: k.threadID, RunID: k.runID, Outcome: b})
	}
}

func (k *aguiSink) end(id, kind string) {
	if _, ok := k.open[id]; !ok {
		return
	}
	delete(k.open, id)
	if kind == turnview.KindReasoning {
		k.event(aguiEvent{Type: "REASONING_MESSAGE_END", MessageID: id})
		k.event(aguiEvent{Type: "REASONING_END", MessageID: id})
		return
	}
	k.event(aguiEvent{Type: "TEXT_MESSAGE_END", MessageID: id})
}

// closeOpen ends the messages still open: a run may not end inside one.
func (k *aguiSink) closeOpen() {
	for id, kind := range k.open {
		k.end(id, kind)
	}
}

// toolResultText is a tool's output as AG-UI content: a JSON string as its
// text, anything else as its JSON.
func toolResultText(out json.RawMessage) string {
	var s string
	if len(out) > 0 && out[0] == '"' && json.Unmarshal(out, &s) == nil {
		return s
	}
	return string(rawOrNull(out))
}

func (k *aguiSink) Keepalive()   { k.w.comment("keepalive") }
func (k *aguiSink) Flush() error { return k.w.flush() }
