package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/log"
	"github.com/labstack/echo/v4"
	"github.com/oklog/ulid/v2"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// LifecycleLog is what the lifecycle routes read of the log, beyond Log;
// *log.DB satisfies it. The routes exist when Options.Log has it. The
// changes themselves go through Options.Conversations.
type LifecycleLog interface {
	InstancesVisible(ctx context.Context, agent, cursor string, limit int, visible func(instance string) bool) ([]log.InstanceInfo, string, error)
	Sessions(ctx context.Context, agent, instance string) ([]log.SessionInfo, error)
	Checkpoints(ctx context.Context, key record.Key) ([]log.Checkpoint, error)
	Generation(ctx context.Context, agent, instance string) (string, error)
}

var _ LifecycleLog = (*log.DB)(nil)

// lifecycle serves the routes that list, rewind, regenerate, fork, reset
// and delete conversations. Each change is one call of the conversation
// core, which serialises the changes of a session and stops its turns.
type lifecycle struct {
	s    *Server
	log  LifecycleLog
	conv Conversations
}

func (s *Server) lifecycleRoutes(e *echo.Echo, base string, ll LifecycleLog) {
	l := &lifecycle{s: s, log: ll, conv: s.opts.Conversations}
	e.GET("/agents/:name", l.instances)
	e.GET(base+"/sessions", l.sessions)
	e.GET(base+"/checkpoints", l.checkpoints)
	e.POST(base+"/rewind", l.rewind)
	e.POST(base+"/regenerate", l.regenerate)
	e.POST(base+"/fork", l.fork)
	e.POST(base+"/reset", l.reset)
	e.DELETE(base, l.delete)
}

// changeRequest is a lifecycle POST's body. Which fields a route takes is
// checked by the route.
type changeRequest struct {
	EntryID    *string `json:"entryId"`
	Session    *string `json:"session"`
	InstanceID *string `json:"instanceId"`
}

// mutation reads what every lifecycle change shares: the route's instance,
// the Idempotency-Key, and the optional JSON body.
type mutation struct {
	agent, instance string
	idemKey, hash   string
	body            changeRequest
	hasBody         bool
}

func (l *lifecycle) readMutation(c echo.Context, allowed ...string) (*mutation, error) {
	if l.s.stopAd.Load() {
		return nil, apiErr(http.StatusServiceUnavailable, wire.CodeShuttingDown, "the server is shutting down and changes nothing")
	}
	agent, instance, err := l.s.instance(c)
	if err != nil {
		return nil, err
	}
	req := c.Request()
	m := &mutation{agent: agent, instance: instance}
	if m.idemKey, err = idempotencyKey(req.Header); err != nil {
		return nil, err
	}
	body, release, err := l.s.readBody(c)
	if err != nil {
		return nil, err
	}
	// Only the decoded fields and a hash outlive this function.
	defer release()
	if len(bytes.TrimSpace(body)) > 0 {
		if err := checkJSONContentType(req.Header.Get(echo.HeaderContentType)); err != nil {
			return nil, err
		}
		if err := strictUnmarshal(body, &m.body); err != nil {
			return nil, badRequest("%s", describeJSONError(err, ""))
		}
		m.hasBody = true
		given := map[string]bool{"entryId": m.body.EntryID != nil, "session": m.body.Session != nil, "instanceId": m.body.InstanceID != nil}
		for _, a := range allowed {
			delete(given, a)
		}
		for f, set := range given {
			if set {
				return nil, badRequest("field %q does not belong in this request", f)
			}
		}
	}
	// The route and the caller are part of the request: one key may not
	// serve a rewind and then a reset, nor two principals.
	h := sha256.New()
	h.Write([]byte(req.Method + " " + req.URL.Path + "?" + req.URL.RawQuery + "\n"))
	if p, ok := PrincipalOf(c); ok {
		h.Write([]byte(p.Issuer + "\x00" + p.Subject + "\n"))
	}
	h.Write(body)
	m.hash = hex.EncodeToString(h.Sum(nil))
	return m, nil
}

// session is the session a change applies to: the body's "session" field,
// else the query's, else "default".
func (m *mutation) session(c echo.Context) (record.Key, error) {
	if m.body.Session != nil {
		if err := record.ValidateName(*m.body.Session); err != nil {
			return record.Key{}, &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "session: " + err.Error(), Cause: err}
		}
		return record.Key{Agent: m.agent, Instance: m.instance, Session: *m.body.Session}, nil
	}
	return sessionKey(c, m.agent, m.instance)
}

func (m *mutation) change(kind log.ChangeKind, key record.Key) log.Change {
	ch := log.Change{Kind: kind, Key: key, IdempotencyKey: m.idemKey, RequestHash: m.hash}
	if m.body.EntryID != nil {
		ch.EntryID = *m.body.EntryID
	}
	return ch
}

func replayedHeader(c echo.Context, replayed bool) {
	if replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
}

// RewindResult is the 200 body of a rewind and of a reset.
type RewindResult struct {
	Session     string             `json:"session"`
	Incarnation record.Incarnation `json:"incarnation"`
	// LeafID is the active path's new leaf ("" for the very start).
	LeafID string `json:"leafId"`
	// Offset is where to read from to see the change (the truncation, or
	// for a reset "0"); NextOffset is the tail after it.
	Offset     record.Offset `json:"offset"`
	NextOffset record.Offset `json:"nextOffset"`
	// Aborted are the submissions the change settled aborted.
	Aborted []string `json:"aborted"`
	UID     string   `json:"uid,omitempty"`
	// PreviousIncarnation and PreviousTailOffset (a reset only) are the
	// incarnation the reset ended and the tail of the records it removed:
	// a client that read up to there knows it saw all of them.
	PreviousIncarnation record.Incarnation `json:"previousIncarnation,omitempty"`
	PreviousTailOffset  record.Offset      `json:"previousTailOffset,omitempty"`
}

func rewindResult(key record.Key, r log.ChangeResult) RewindResult {
	return RewindResult{Session: key.Session, Incarnation: r.Incarnation, LeafID: r.LeafID,
		Offset: r.Offset, NextOffset: r.NextOffset, Aborted: r.Aborted, UID: r.UID,
		PreviousIncarnation: r.PreviousIncarnation, PreviousTailOffset: r.PreviousTail}
}

// rewind is POST …/rewind {"entryId", "session"?}.
func (l *lifecycle) rewind(c echo.Context) error {
	m, err := l.readMutation(c, "entryId", "session")
	if err != nil {
		return err
	}
	if m.body.EntryID == nil || *m.body.EntryID == "" {
		return badRequest(`"entryId" is required: the user message to rewind to before`)
	}
	key, err := m.session(c)
	if err != nil {
		return err
	}
	res, replayed, err := l.conv.Change(c.Request().Context(), m.change(log.ChangeRewind, key))
	if err != nil {
		return err
	}
	replayedHeader(c, replayed)
	return writeJSON(c, http.StatusOK, rewindResult(key, res))
}

// regenerate is POST …/regenerate {"entryId"?, "session"?}: 202 as a
// delivery.
func (l *lifecycle) regenerate(c echo.Context) error {
	m, err := l.readMutation(c, "entryId", "session")
	if err != nil {
		return err
	}
	key, err := m.session(c)
	if err != nil {
		return err
	}
	ch := m.change(log.ChangeRegenerate, key)
	if p, ok := PrincipalOf(c); ok {
		// The message is delivered again, by this caller.
		who, err := json.Marshal(p)
		if err != nil {
			return err
		}
		ch.Metadata = map[string]json.RawMessage{MetadataPrincipal: who}
	}
	res, replayed, err := l.conv.Change(c.Request().Context(), ch)
	if err != nil {
		return err
	}
	if res.Submission == nil {
		return errors.New("regenerate: no submission in the result")
	}
	sub := *res.Submission
	replayedHeader(c, replayed)
	c.Response().Header().Set(echo.HeaderLocation, instancePath(m.agent, m.instance)+"/submissions/"+url.PathEscape(sub.ID))
	acc := accepted(m.agent, m.instance, key.Session, sub)
	acc.UID = sub.UID
	return writeJSON(c, http.StatusAccepted, acc)
}

// ForkResult is the 201 body of a fork.
type ForkResult struct {
	InstanceID      string             `json:"instanceId"`
	Session         string             `json:"session"`
	UID             string             `json:"uid"`
	Incarnation     record.Incarnation `json:"incarnation"`
	LeafID          string             `json:"leafId"`
	NextOffset      record.Offset      `json:"nextOffset"`
	ConversationURL string             `json:"conversationUrl"`
	UpdatesURL      string             `json:"updatesUrl"`
}

// fork is POST …/fork {"entryId", "instanceId"?, "session"?}: the new
// conversation is the given instance (default this one) and session
// (default "default" in a new instance, a new "fork-…" name in this one);
// the source session is the query's.
func (l *lifecycle) fork(c echo.Context) error {
	m, err := l.readMutation(c, "entryId", "session", "instanceId")
	if err != nil {
		return err
	}
	if m.body.EntryID == nil || *m.body.EntryID == "" {
		return badRequest(`"entryId" is required: the last entry the fork copies`)
	}
	src, err := sessionKey(c, m.agent, m.instance)
	if err != nil {
		return err
	}
	dst := record.Key{Agent: m.agent, Instance: m.instance}
	if m.body.InstanceID != nil {
		if err := record.ValidateName(*m.body.InstanceID); err != nil {
			return &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "instanceId: " + err.Error(), Cause: err}
		}
		dst.Instance = *m.body.InstanceID
	}
	switch {
	case m.body.Session != nil:
		if err := record.ValidateName(*m.body.Session); err != nil {
			return &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "session: " + err.Error(), Cause: err}
		}
		dst.Session = *m.body.Session
	case dst.Instance != src.Instance:
		dst.Session = record.DefaultSession
	case m.idemKey != "":
		// A retry must name the same conversation: derive it from the key.
		sum := sha256.Sum256([]byte(m.idemKey + "\n" + m.hash))
		dst.Session = "fork-" + hex.EncodeToString(sum[:10])
	default:
		dst.Session = "fork-" + strings.ToLower(ulid.Make().String())
	}
	if p, ok := PrincipalOf(c); ok && dst.Instance != src.Instance && !p.Allows(auth.VerbManage, dst.Agent, dst.Instance) {
		return forbidden()
	}
	ch := m.change(log.ChangeFork, src)
	ch.Target = dst
	res, replayed, err := l.conv.Change(c.Request().Context(), ch)
	if err != nil {
		return err
	}
	dst.Instance, dst.Session = res.TargetInstance, res.TargetSession
	replayedHeader(c, replayed)
	q := "?session=" + url.QueryEscape(dst.Session) + "&offset=0"
	p := instancePath(dst.Agent, dst.Instance)
	c.Response().Header().Set(echo.HeaderLocation, p+"/conversation"+q)
	return writeJSON(c, http.StatusCreated, ForkResult{InstanceID: dst.Instance, Session: dst.Session, UID: res.UID,
		Incarnation: res.Incarnation, LeafID: res.LeafID, NextOffset: res.NextOffset,
		ConversationURL: p + "/conversation" + q, UpdatesURL: p + "/stream" + q})
}

// reset is POST …/reset {"session"?}: a new incarnation.
func (l *lifecycle) reset(c echo.Context) error {
	m, err := l.readMutation(c, "session")
	if err != nil {
		return err
	}
	key, err := m.session(c)
	if err != nil {
		return err
	}
	res, replayed, err := l.conv.Change(c.Request().Context(), m.change(log.ChangeReset, key))
	if err != nil {
		return err
	}
	replayedHeader(c, replayed)
	return writeJSON(c, http.StatusOK, rewindResult(key, res))
}

// DeleteResult is the 200 body of a delete.
type DeleteResult struct {
	InstanceID string   `json:"instanceId"`
	UID        string   `json:"uid"`
	Sessions   []string `json:"sessions"`
	Aborted    []string `json:"aborted"`
	Purged     bool     `json:"purged"`
}

// delete is DELETE /agents/:name/:instanceId[?purge=true].
func (l *lifecycle) delete(c echo.Context) error {
	m, err := l.readMutation(c)
	if err != nil {
		return err
	}
	if m.hasBody {
		return badRequest("a delete takes no body")
	}
	purge := false
	if vs, ok := c.QueryParams()["purge"]; ok {
		if purge, err = strconv.ParseBool(vs[0]); err != nil {
			return badRequest("purge must be true or false, not %q", record.Clip(vs[0], 40))
		}
	}
	ch := m.change(log.ChangeDelete, record.Key{Agent: m.agent, Instance: m.instance, Session: record.DefaultSession})
	ch.Purge = purge
	res, replayed, err := l.conv.Change(c.Request().Context(), ch)
	if err != nil {
		return err
	}
	replayedHeader(c, replayed)
	return writeJSON(c, http.StatusOK, DeleteResult{InstanceID: m.instance, UID: res.UID, Sessions: res.Sessions, Aborted: res.Aborted, Purged: res.Purged})
}

// instances is GET /agents/:name?cursor=&limit=.
func (l *lifecycle) instances(c echo.Context) error {
	agent := pathParam(c, "name")
	if err := record.ValidateName(agent); err != nil {
		return &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "agent: " + err.Error(), Cause: err}
	}
	if err := l.s.agentExists(agent); err != nil {
		return err
	}
	limit := 100
	if vs, ok := c.QueryParams()["limit"]; ok {
		n, err := strconv.Atoi(vs[0])
		if err != nil || n < 1 || n > log.MaxInstancesPage {
			return apiErr(http.StatusBadRequest, wire.CodeInvalidLimit, "limit must be an integer from 1 to %d, not %q", log.MaxInstancesPage, record.Clip(vs[0], 40))
		}
		limit = n
	}
	raw, err := l.s.cursors.open(agent, c.QueryParam("cursor"))
	if err != nil {
		return apiErr(http.StatusBadRequest, wire.CodeInvalidCursor, "the cursor is not one this server gave out")
	}
	// Only what the caller may read, filtered during the walk: a page and
	// its cursor are made of what the caller may see.
	var visible func(string) bool
	if p, ok := PrincipalOf(c); ok {
		visible = func(instance string) bool { return p.Allows(auth.VerbRead, agent, instance) }
	}
	list, next, err := l.log.InstancesVisible(c.Request().Context(), agent, raw, limit, visible)
	if errors.Is(err, log.ErrInvalidOffset) {
		return apiErr(http.StatusBadRequest, wire.CodeInvalidCursor, "the cursor is not one this server gave out")
	}
	if err != nil {
		return err
	}
	next = l.s.cursors.seal(agent, next)
	var nc *string
	if next != "" {
		nc = &next
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return writeJSON(c, http.StatusOK, struct {
		Instances  []log.InstanceInfo `json:"instances"`
		NextCursor *string            `json:"nextCursor"`
	}{list, nc})
}

// sessions is GET …/sessions.
func (l *lifecycle) sessions(c echo.Context) error {
	agent, instance, err := l.s.instance(c)
	if err != nil {
		return err
	}
	list, err := l.log.Sessions(c.Request().Context(), agent, instance)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return writeJSON(c, http.StatusOK, struct {
		Sessions []log.SessionInfo `json:"sessions"`
	}{list})
}

// checkpoints is GET …/checkpoints?session=.
func (l *lifecycle) checkpoints(c echo.Context) error {
	agent, instance, err := l.s.instance(c)
	if err != nil {
		return err
	}
	key, err := sessionKey(c, agent, instance)
	if err != nil {
		return err
	}
	list, err := l.log.Checkpoints(c.Request().Context(), key)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return writeJSON(c, http.StatusOK, struct {
		Checkpoints []log.Checkpoint `json:"checkpoints"`
	}{list})
}
