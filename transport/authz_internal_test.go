package transport

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/convlog/convlog/log"
)

type noAgents struct{}

func (noAgents) Agent(string) (string, bool) { return "", false }

// Every route the server registers has an access rule: with access control
// on, a route without one would be closed to everyone by default, and this
// test says which rule is missing instead.
func TestEveryRouteHasAnAccessRule(t *testing.T) {
	db, err := log.Open(filepath.Join(t.TempDir(), "convlog.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(Options{Log: db, Agents: noAgents{}, Abort: func(ctx context.Context, id string) (log.Submission, error) { return log.Submission{}, nil },
		Metrics: http.NotFoundHandler(), Backup: func(context.Context, func(int64) (io.Writer, error)) (int64, error) { return 0, nil },
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
