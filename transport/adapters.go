package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/convlog/convlog/internal/conversation/turnview"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"
)

// Shared plumbing of the client adapters (aisdk.go, agui.go, a2a.go): they
// admit a user message exactly as POST /agents/... does and show the answer
// through a turnview.View, whose events each adapter's sink encodes in its
// client's format.

// adapterAgentName is the :agent parameter, checked as a name. Whether the
// agent exists is asked only after the caller's scopes allow the
// conversation (agentExists), so that a refusal says nothing of it.
func adapterAgentName(c echo.Context) (string, error) {
	agent := pathParam(c, "agent")
	if err := record.ValidateName(agent); err != nil {
		return "", &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "agent: " + err.Error(), Cause: err}
	}
	return agent, nil
}

// agentExists is nil when the agent is served, else a 404.
func (s *Server) agentExists(agent string) error {
	_, err := s.opts.Conversations.Agent(agent)
	return err
}

// adapterAgent is adapterAgentName and agentExists together, for the
// routes whose caller needs no scope (the A2A cards).
func (s *Server) adapterAgent(c echo.Context) (agent string, err error) {
	if agent, err = adapterAgentName(c); err != nil {
		return "", err
	}
	return agent, s.agentExists(agent)
}

// validInstance checks a client-chosen conversation id (a chat id, a thread
// id, a context id) as an instance name.
func validInstance(what, id string) error {
	if err := record.ValidateName(id); err != nil {
		return &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: what + ": " + err.Error(), Cause: err}
	}
	return nil
}

// adapterAdmission is a user message an adapter admits.
type adapterAdmission struct {
	key     record.Key
	payload record.MessagePayload
	// idem makes a retry of the same client message (same client id) return
	// the first admission: the scope ("ai-sdk", "ag-ui", "a2a") and the
	// client's message id. Empty for none.
	idemScope, idemID string
	// subID is the submission id to use; "" generates one.
	subID string
}

// admitMessage admits the message durably, as deliver does: through the
// conversation core, with the same idempotency.
func (s *Server) admitMessage(c echo.Context, a adapterAdmission) (record.Submission, bool, error) {
	ctx := c.Request().Context()
	if s.stopAd.Load() {
		return record.Submission{}, false, apiErr(http.StatusServiceUnavailable, wire.CodeShuttingDown, "the server is shutting down and admits nothing")
	}
	d := Delivery{Session: a.key.Session, Payload: a.payload}
	// The caller is recorded with the message, as deliver does.
	principal, authed := PrincipalOf(c)
	if err := recordPrincipal(&d, principal, authed); err != nil {
		return record.Submission{}, false, err
	}
	rec, err := d.Record()
	if err != nil {
		return record.Submission{}, false, badRequest("the message cannot be stored: %v", err)
	}
	adm := log.Admission{Key: a.key, SubmissionID: a.subID, Records: []record.Record{rec}}
	if a.idemID != "" {
		// Client ids are free text: hashed into a key of bounded, safe
		// characters, scoped by adapter and conversation.
		h := sha256.Sum256([]byte(a.idemScope + "\x00" + a.key.String() + "\x00" + a.idemID))
		adm.IdempotencyKey = a.idemScope + ":" + hex.EncodeToString(h[:])
		p, _ := json.Marshal(a.payload)
		// The caller is part of the request: another principal reusing
		// a message id gets a 422, never the first caller's answer.
		adm.RequestHash = requestHash(a.key.Agent, a.key.Instance, principal.Issuer+"\x00"+principal.Subject, p)
	}
	return s.opts.Conversations.Admit(ctx, adm)
}

// openSSE starts an event-stream response with extra headers and returns
// its writer. The connection lasts as long as the client stays, with a
// deadline per write.
func (s *Server) openSSE(c echo.Context, header map[string]string) *sseWriter {
	res := c.Response()
	rc := http.NewResponseController(res.Writer)
	_ = rc.SetWriteDeadline(time.Time{})
	h := res.Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set(echo.HeaderCacheControl, "no-cache")
	h.Set("X-Accel-Buffering", "no")
	for k, v := range header {
		h.Set(k, v)
	}
	res.WriteHeader(http.StatusOK)
	return &sseWriter{w: res, rc: rc, timeout: s.opts.WriteTimeout}
}

// compactJSON marshals v without HTML escaping and without the encoder's
// trailing newline: one SSE data line or NDJSON line.
func compactJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return []byte(`{}`)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// rawOrNull is a stored JSON value, null when absent.
func rawOrNull(r json.RawMessage) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return r
}

// failureText is a failure as one line of text for a client.
func failureText(f *record.Failure, outcome record.Outcome) string {
	if f == nil {
		return "the submission " + string(outcome)
	}
	if f.Code != "" {
		return f.Code + ": " + f.Message
	}
	return f.Message
}

// turnView prepares the view of sub for an adapter's sink. fresh says that
// cursor followed the deltas before the turn answering sub could have
// published any.
func (s *Server) turnView(key record.Key, sub record.Submission, cursor DeltaCursor, fresh bool, sink turnview.Sink) *turnview.View {
	c := turnview.Config{Log: s.db, Heartbeat: s.opts.Heartbeat, PageLimit: streamPageLimit, Stopping: s.closing}
	return turnview.New(c, key, sub, cursor, fresh, sink) // a nil cursor stays a nil Deltas
}

// followDeltas opens a delta cursor for key, or nil when there is no source
// or it fails (the view then serves the log alone).
func (s *Server) followDeltas(ctx context.Context, key record.Key) DeltaCursor {
	if s.opts.Deltas == nil {
		return nil
	}
	cur, err := s.opts.Deltas.FollowDeltas(key)
	if err != nil {
		s.log.WarnContext(ctx, "following deltas", "key", key.String(), "err", err)
		return nil
	}
	return cur
}

// viewCursor opens what a view of sub needs: a delta cursor opened before the
// submission's status is read, so that fresh is exact (no frame of its turn
// can predate the cursor when it had not started). The caller closes the
// cursor.
func (s *Server) viewCursor(ctx context.Context, key record.Key, subID string) (DeltaCursor, record.Submission, bool, error) {
	cur := s.followDeltas(ctx, key)
	sub, err := s.db.Submission(ctx, subID)
	if err != nil {
		if cur != nil {
			cur.Close()
		}
		return nil, sub, false, err
	}
	return cur, sub, sub.Status == record.StatusAdmitted, nil
}

// adapterRequest reads a streaming adapter's POST: its agent and its JSON
// body. The answer may stream for a whole turn, so the body's share of the
// body budget ends with decoding and admission, not with the request:
// release (idempotent) is deferred by the caller and called early once the
// message is admitted.
func (s *Server) adapterRequest(c echo.Context) (agent string, body []byte, release func(), err error) {
	if agent, err = adapterAgentName(c); err != nil {
		return "", nil, nil, err
	}
	if err := checkJSONContentType(c.Request().Header.Get(echo.HeaderContentType)); err != nil {
		return "", nil, nil, err
	}
	body, free, err := s.readBody(c)
	if err != nil {
		return "", nil, nil, err
	}
	var once sync.Once
	return agent, body, func() { once.Do(free) }, nil
}
