package transport

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// Authenticator is what the server needs of access control;
// *auth.Authenticator satisfies it.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (auth.Principal, error)
}

// access is what a route requires of its caller.
type access struct {
	public bool      // no credentials: health checks and the like
	verb   auth.Verb // the scope verb on the path's :name/:instanceId
	// stream routes accept a stream token (?access_token=) for what
	// EventSource opens; the handlers count their long-lived responses
	// against the stream caps (beginStream).
	stream bool
	// deliver routes draw from the principal's delivery rate.
	deliver bool
	// listing routes name only an agent: the verb must be allowed on some
	// instance of it, and the handler shows only the instances it allows.
	listing bool
	// scoped routes (the client adapters) name their conversation in the
	// body or in their own parameters: the middleware authenticates, and
	// the handler checks the scopes as soon as it knows the conversation,
	// before any lookup (adapters_authz.go).
	scoped bool
	// catalog routes name no agent: any authenticated caller, and the
	// handler shows only what the caller's scopes reach.
	catalog bool
}

// routeAccess is the access rule of every route, by method and pattern.
// With access control on, a route missing here is refused to everyone
// (403): a new route is closed until someone decides who may call it.
var routeAccess = map[string]access{
	"GET /healthz":                   {public: true},
	"GET /readyz":                    {public: true},
	"GET /agents":                    {catalog: true},
	"POST /agents/:name/:instanceId": {verb: auth.VerbDeliver, deliver: true},
	"GET /agents/:name/:instanceId/conversation":                         {verb: auth.VerbRead},
	"GET /agents/:name/:instanceId/stream":                               {verb: auth.VerbRead, stream: true},
	"GET /agents/:name/:instanceId/submissions/:submissionId":            {verb: auth.VerbRead},
	"POST /agents/:name/:instanceId/submissions/:submissionId/abort":     {verb: auth.VerbAbort},
	"POST /agents/:name/:instanceId/submissions/:submissionId/approvals": {verb: auth.VerbApprove},
	"POST /agents/:name/:instanceId/stream-token":                        {verb: auth.VerbRead},
	// The lifecycle routes (lifecycle.go). A fork also needs manage on the
	// instance it creates, checked by the handler.
	"GET /agents/:name":                         {verb: auth.VerbRead, listing: true},
	"GET /agents/:name/:instanceId/sessions":    {verb: auth.VerbRead},
	"GET /agents/:name/:instanceId/checkpoints": {verb: auth.VerbRead},
	"POST /agents/:name/:instanceId/rewind":     {verb: auth.VerbManage},
	"POST /agents/:name/:instanceId/regenerate": {verb: auth.VerbManage, deliver: true},
	"POST /agents/:name/:instanceId/fork":       {verb: auth.VerbManage},
	"POST /agents/:name/:instanceId/reset":      {verb: auth.VerbManage},
	"DELETE /agents/:name/:instanceId":          {verb: auth.VerbManage},
	// The client adapters (adapters.md): deliver and read the conversation
	// of the body (POST) or of :chatId; A2A's verbs depend on the method.
	"POST /ai-sdk/:agent":                         {scoped: true, deliver: true, stream: true},
	"GET /ai-sdk/:agent/:chatId/stream":           {scoped: true, stream: true},
	"POST /ag-ui/:agent":                          {scoped: true, deliver: true, stream: true},
	"POST /a2a/:agent":                            {scoped: true},
	"GET /a2a/:agent/.well-known/agent-card.json": {public: true},
	"GET /.well-known/agent-card.json":            {public: true},
	// The console's and the JS client's static files hold no data: the
	// console asks for a token and sends it on the API calls it makes.
	"GET /console":             {public: true},
	"GET /console/*":           {public: true},
	"GET /console/routes.json": {public: true},
	"GET /client/*":            {public: true},
	// The projected view: JSON or SSE, so it counts as a stream, and
	// EventSource may open it with a stream token.
	"GET " + messagesRoute: {verb: auth.VerbRead, stream: true},
	"GET /openapi.json":    {public: true}, // the API's shape, no data
	"GET /metrics":         {verb: auth.VerbAdmin},
	"POST /admin/backup":   {verb: auth.VerbAdmin}, // every conversation
}

const messagesRoute = "/agents/:name/:instanceId/messages"

const principalKey = "convlog.principal"

// PrincipalOf is the authenticated caller of a request; ok is false when
// access control is off.
func PrincipalOf(c echo.Context) (p auth.Principal, ok bool) {
	p, ok = c.Get(principalKey).(auth.Principal)
	return p, ok
}

// authorize is the access-control middleware: authentication (401), then
// the route's scope on the path's agent and instance (403), then the
// principal's limits (429). Every refusal happens before any lookup, so a
// caller who may not read a conversation learns nothing of whether it
// exists: a 403 for it and for a missing one are the same.
func (s *Server) authorize(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.opts.Auth == nil {
			return next(c)
		}
		req := c.Request()
		rule, known := routeAccess[req.Method+" "+c.Path()]
		if rule.public || req.Method == http.MethodOptions {
			return next(c)
		}
		p, err := s.authenticate(c, rule)
		if err != nil {
			s.log.DebugContext(req.Context(), "unauthenticated request", "path", req.URL.Path, "err", err)
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="convlog"`)
			return s.refused(&wire.APIError{Status: http.StatusUnauthorized, Code: wire.CodeUnauthorized, Cause: err,
				Message: "a valid bearer token is required (Authorization: Bearer …)"}, "")
		}
		c.Set(principalKey, p)
		if !known {
			if c.Path() == "" || c.Path() == "/*" {
				return next(c) // no such route: the 404 tells nothing of any conversation
			}
			return s.refused(forbidden(), "")
		}
		if rule.catalog {
			return next(c)
		}
		if rule.listing {
			if !p.AllowsAgent(rule.verb, pathParam(c, "name")) {
				return s.refused(forbidden(), "")
			}
		} else if !rule.scoped && !p.Allows(rule.verb, pathParam(c, "name"), pathParam(c, "instanceId")) {
			return s.refused(forbidden(), "")
		}
		if rule.deliver {
			if err := s.drawDelivery(c); err != nil {
				return err
			}
		}
		return next(c)
	}
}

// authenticate finds the caller: a bearer token, or on stream routes a
// stream token in ?access_token= (what EventSource can send).
func (s *Server) authenticate(c echo.Context, rule access) (auth.Principal, error) {
	req := c.Request()
	// The messages view is also JSON: a stream token opens only its SSE
	// form, as it opens only streams everywhere (docs/security.md).
	sse := rule.stream && (c.Path() != messagesRoute || wantsEventStream(req.Header.Get(echo.HeaderAccept)))
	if h := req.Header.Get(echo.HeaderAuthorization); h != "" || !sse {
		return s.opts.Auth.Authenticate(req.Context(), auth.BearerToken(h))
	}
	tok := c.QueryParam("access_token")
	if tok == "" {
		return auth.Principal{}, fmt.Errorf("%w: no bearer token and no access_token", auth.ErrUnauthorized)
	}
	session := c.QueryParam("session")
	if session == "" {
		session = record.DefaultSession
	}
	return s.streamTokens.Verify(tok, auth.Conversation{Agent: pathParam(c, "name"), Instance: pathParam(c, "instanceId"), Session: session}, time.Now())
}

// streamToken issues a short-lived token that opens streams of one
// conversation, for EventSource (?access_token=). Without access control
// there is nothing to issue: the token is empty and the URL plain.
func (s *Server) streamToken(c echo.Context) error {
	agent, instance, err := s.instance(c)
	if err != nil {
		return err
	}
	key, err := sessionKey(c, agent, instance)
	if err != nil {
		return err
	}
	session := key.Session
	q := url.Values{"session": {session}}
	var out struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expiresAt,omitzero"`
		StreamURL string    `json:"streamUrl"`
	}
	if p, ok := PrincipalOf(c); ok && s.streamTokens != nil {
		out.Token, out.ExpiresAt = s.streamTokens.Issue(p, auth.Conversation{Agent: agent, Instance: instance, Session: session}, time.Now(), auth.StreamTokenTTL)
		q.Set("access_token", out.Token)
	}
	out.StreamURL = instancePath(agent, instance) + "/stream?" + q.Encode()
	return writeJSON(c, http.StatusOK, out)
}

// refused counts a refusal of access control, then returns it.
func (s *Server) refused(e *wire.APIError, limit string) *wire.APIError {
	if s.opts.Observer != nil {
		s.opts.Observer.AccessRefused(e.Code, limit)
	}
	return e
}

func forbidden() *wire.APIError {
	return &wire.APIError{Status: http.StatusForbidden, Code: wire.CodeForbidden,
		Message: "the token does not allow this on this conversation, or the conversation does not exist"}
}
