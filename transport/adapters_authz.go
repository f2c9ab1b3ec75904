package transport

import (
	"math"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/internal/auth"
)

// allowConversation checks, with access control on, that the caller's
// scopes allow every verb on agent/instance: the adapters' routes name
// their conversation in the body, so this runs in the handler, as soon as
// the conversation is known and before anything is looked up, and a 403 for
// a conversation that exists and for one that does not are the same.
func (s *Server) allowConversation(c echo.Context, agent, instance string, verbs ...auth.Verb) error {
	p, ok := PrincipalOf(c)
	if !ok {
		return nil
	}
	for _, v := range verbs {
		if !p.Allows(v, agent, instance) {
			return s.refused(forbidden(), "")
		}
	}
	return nil
}

// allows is allowConversation as a bool, for lookups that must answer "not
// found" rather than "forbidden" (A2A task ids).
func (s *Server) allows(c echo.Context, agent, instance string, verb auth.Verb) bool {
	p, ok := PrincipalOf(c)
	return !ok || p.Allows(verb, agent, instance)
}

// drawDelivery takes one delivery from the caller's rate (the middleware's
// deliver routes, and A2A sends, where the method decides).
func (s *Server) drawDelivery(c echo.Context) error {
	p, ok := PrincipalOf(c)
	if !ok || s.limits == nil {
		return nil
	}
	if ok, wait := s.limits.AllowDelivery(p); !ok {
		c.Response().Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		return s.refused(&APIError{Status: http.StatusTooManyRequests, Code: CodeRateLimited,
			Message: "too many deliveries from this principal; retry after the Retry-After seconds"}, "deliveries")
	}
	return nil
}

// openStream counts a stream against the caller's cap; release must be
// called when it ends.
func (s *Server) openStream(c echo.Context) (release func(), err error) {
	p, ok := PrincipalOf(c)
	if !ok || s.limits == nil {
		return func() {}, nil
	}
	release, ok = s.limits.OpenStream(p)
	if !ok {
		c.Response().Header().Set("Retry-After", "5")
		return nil, s.refused(&APIError{Status: http.StatusTooManyRequests, Code: CodeRateLimited,
			Message: "this principal has as many streams open as it may; close one first"}, "streams")
	}
	return release, nil
}
