package transport

import (
	"sort"
	"strings"

	"github.com/convlog/convlog/internal/auth"
)

// ConversationRoute is a route whose access rule is a verb on the path's
// agent and instance, for the access matrix test.
type ConversationRoute struct {
	Method, Pattern string
	Verb            auth.Verb
}

// ConversationRoutes lists every such rule, so the matrix covers routes
// added later without being told.
func ConversationRoutes() []ConversationRoute {
	var out []ConversationRoute
	for k, a := range routeAccess {
		method, pattern, _ := strings.Cut(k, " ")
		if a.public || a.scoped || a.catalog || a.listing || a.verb == "" || !strings.Contains(pattern, ":instanceId") {
			continue
		}
		out = append(out, ConversationRoute{method, pattern, a.verb})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Method+out[i].Pattern < out[j].Method+out[j].Pattern })
	return out
}

// SetStreamOpenedHook runs f in every stream between its connected comment
// and its first page, until the returned restore is called.
func SetStreamOpenedHook(f func()) (restore func()) {
	testHookStreamOpened = f
	return func() { testHookStreamOpened = nil }
}

// PrincipalStreams is the principal's stream cap in force.
func (s *Server) PrincipalStreams() int { return s.opts.Limits.Streams }
