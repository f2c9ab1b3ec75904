package transport

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
)

// noConversations serves no agent: the test only lists routes.
type noConversations struct{}

func (noConversations) Agent(name string) (worker.AgentOptions, error) {
	return worker.AgentOptions{}, conversation.ErrUnknownAgent
}
func (noConversations) Agents() []worker.AgentInfo { return nil }
func (noConversations) Admit(context.Context, log.Admission) (record.Submission, bool, error) {
	return record.Submission{}, false, conversation.ErrUnknownAgent
}
func (noConversations) Abort(context.Context, string) (record.Submission, error) {
	return record.Submission{}, log.ErrSubmissionNotFound
}
func (noConversations) AbortSession(context.Context, record.Key) error { return nil }
func (noConversations) Change(context.Context, log.Change) (log.ChangeResult, bool, error) {
	return log.ChangeResult{}, false, conversation.ErrUnknownAgent
}
func (noConversations) Decide(context.Context, log.Decide) (log.Decided, bool, error) {
	return log.Decided{}, false, conversation.ErrUnknownAgent
}

// Every route the server registers has an access rule: with access control
// on, a route without one would be closed to everyone by default, and this
// test says which rule is missing instead.
func TestEveryRouteHasAnAccessRule(t *testing.T) {
	db, err := log.Open(filepath.Join(t.TempDir(), "convlog.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(Options{Log: db, Conversations: noConversations{},
		Metrics: http.NotFoundHandler(), Backup: db,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range s.echo.Routes() {
		if r.Method == "echo_route_not_found" || r.Path == "/*" {
			continue
		}
		if _, ok := routeAccess[r.Method+" "+r.Path]; !ok {
			t.Errorf("route %s %s has no entry in routeAccess", r.Method, r.Path)
		}
	}
}
