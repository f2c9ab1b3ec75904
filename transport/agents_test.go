package transport_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/worker"
)

func withAgentList(list ...worker.AgentInfo) envOption {
	return func(o *envConfig) { o.ListAgents = list }
}

// GET /agents names the agents, with access control only those the
// caller may read; without a token it is 401 like any protected route.
func TestListAgents(t *testing.T) {
	list := withAgentList(worker.AgentInfo{Name: "echo", Kind: "echo", Busy: worker.BusyJoin}, worker.AgentInfo{Name: "strict", Kind: "http", Busy: worker.BusyReject})
	open := newEnv(t, list)
	st, _, body := open.do(t, http.MethodGet, "/agents", nil, nil)
	if st != http.StatusOK || strings.TrimSpace(string(body)) != `{"agents":[{"name":"echo","kind":"echo","busy":"join"},{"name":"strict","kind":"http","busy":"reject"}]}` {
		t.Fatalf("%d %s", st, body)
	}
	a := staticTokens(t, map[string][]string{"reader": {"read:strict/*"}, "nothing": {}})
	e := newEnv(t, list, withAuth(a, auth.Limits{}))
	if st, _, _ := e.do(t, http.MethodGet, "/agents", nil, nil); st != http.StatusUnauthorized {
		t.Fatalf("no token: %d", st)
	}
	st, _, body = e.do(t, http.MethodGet, "/agents", nil, map[string]string{"Authorization": "Bearer reader"})
	if st != http.StatusOK || strings.TrimSpace(string(body)) != `{"agents":[{"name":"strict","kind":"http","busy":"reject"}]}` {
		t.Fatalf("reader: %d %s", st, body)
	}
	st, _, body = e.do(t, http.MethodGet, "/agents", nil, map[string]string{"Authorization": "Bearer nothing"})
	if st != http.StatusOK || strings.TrimSpace(string(body)) != `{"agents":[]}` {
		t.Fatalf("nothing: %d %s", st, body)
	}
}
