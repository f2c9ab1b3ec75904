package transport

import (
	"math"
	"net/http"
	"strconv"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/transport/wire"
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
		return s.refused(&wire.APIError{Status: http.StatusTooManyRequests, Code: wire.CodeRateLimited,
			Message: "too many deliveries from this principal; retry after the Retry-After seconds"}, "deliveries")
	}
	return nil
}

// beginStream counts a long-lived response (a stream, a turn's answer, a
// blocking A2A send) against both caps: the server's MaxStreams and, with
// access control, the principal's stream limit. Over either it is 503
// too_many_streams with Retry-After: each such response holds a
// descriptor for as long as its reader stays, and the descriptors that
// deliveries, health checks and the log need must not run out. release
// must be called when the response ends; it is idempotent.
func (s *Server) beginStream(c echo.Context) (release func(), err error) {
	if n := s.streams.Add(1); n > int64(s.opts.MaxStreams) {
		s.streams.Add(-1)
		return nil, overloaded(c, wire.CodeTooManyStreams, "%d streams are open, the most this server takes; retry shortly, or read by polling", s.opts.MaxStreams)
	}
	free := func() {}
	if p, ok := PrincipalOf(c); ok && s.limits != nil {
		f, ok := s.limits.OpenStream(p)
		if !ok {
			s.streams.Add(-1)
			return nil, s.refused(overloaded(c, wire.CodeTooManyStreams,
				"this principal has %d streams open, the most it may; close one first", s.opts.Limits.Streams), "streams")
		}
		free = f
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			free()
			s.streams.Add(-1)
		})
	}, nil
}
