package transport_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/convlog/convlog/internal/auth"
)

// With access control on, the adapters check the scopes of the
// conversation their body (or :chatId) names, before anything is looked up:
// a refused conversation that exists and one that does not, or an agent that
// does not exist, answer the same 403. The A2A cards are public.
func TestAdapterAccess(t *testing.T) {
	a := staticTokens(t, map[string][]string{
		"alice":  {"read:echo/{sub}", "deliver:echo/{sub}", "abort:echo/{sub}"},
		"bob":    {"read:echo/{sub}", "deliver:echo/{sub}"},
		"reader": {"read:echo/*"},
	})
	e := newEnv(t, withAuth(a, auth.Limits{}))
	bearer := func(tok string) map[string]string {
		h := map[string]string{"Content-Type": "application/json"}
		if tok != "" {
			h["Authorization"] = "Bearer " + tok
		}
		return h
	}
	post := func(path, body, tok string) (int, []byte) {
		st, _, b := e.do(t, http.MethodPost, path, strings.NewReader(body), bearer(tok))
		return st, b
	}
	cases := []struct {
		name, path, body, tok string
		want                  int
	}{
		{"ai-sdk no token", "/ai-sdk/echo", aiSDKBody("alice", "m", "x"), "", 401},
		{"ai-sdk other's chat", "/ai-sdk/echo", aiSDKBody("bob", "m", "x"), "alice", 403},
		{"ai-sdk reader cannot send", "/ai-sdk/echo", aiSDKBody("alice", "m", "x"), "reader", 403},
		{"ai-sdk unknown agent is no oracle", "/ai-sdk/nobody", aiSDKBody("bob", "m", "x"), "alice", 403},
		{"ai-sdk regenerate needs manage", "/ai-sdk/echo", `{"id":"alice","trigger":"regenerate-message","messages":[{"id":"m","role":"user","parts":[{"type":"text","text":"x"}]}]}`, "alice", 403},
		{"ag-ui other's thread", "/ag-ui/echo", `{"threadId":"bob","runId":"r","messages":[{"id":"u","role":"user","content":"x"}]}`, "alice", 403},
		{"a2a other's context", "/a2a/echo", `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","contextId":"bob","role":"ROLE_USER","parts":[{"text":"x"}]}}}`, "alice", 403},
		{"a2a list other's context", "/a2a/echo", `{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"contextId":"bob"}}`, "alice", 403},
	}
	for _, c := range cases {
		if st, b := post(c.path, c.body, c.tok); st != c.want {
			t.Errorf("%s: %d %s", c.name, st, b)
		}
	}
	for _, c := range []struct{ path, tok string }{{"/ai-sdk/echo/bob/stream", "alice"}, {"/ai-sdk/nobody/alice/stream", "nobody"}} {
		if st, _, b := e.do(t, http.MethodGet, c.path, nil, bearer(c.tok)); st != http.StatusForbidden && st != http.StatusUnauthorized {
			t.Errorf("resume %s: %d %s", c.path, st, b)
		}
	}

	// Allowed: alice's own chat, then a reader resumes it (204: idle).
	lb := openLive(t, e, http.MethodPost, "/ai-sdk/echo", aiSDKBody("alice", "m1", "x"), map[string]string{"Authorization": "Bearer alice"})
	if lb.resp.StatusCode != http.StatusOK {
		t.Fatalf("alice's send: %d", lb.resp.StatusCode)
	}
	lb.resp.Body.Close()
	// The answer is pending (no worker here): the resume streams it.
	resumed := openLive(t, e, http.MethodGet, "/ai-sdk/echo/alice/stream", "", map[string]string{"Authorization": "Bearer reader"})
	if resumed.resp.StatusCode != http.StatusOK {
		t.Fatalf("reader's resume: %d", resumed.resp.StatusCode)
	}
	resumed.waitFor(t, `"type":"start"`)
	resumed.resp.Body.Close()

	// A2A: the card needs no token; a task in a context the caller may
	// not read is not found, as a task that never was.
	if st, _, b := e.do(t, http.MethodGet, "/a2a/echo/.well-known/agent-card.json", nil, nil); st != http.StatusOK || !strings.Contains(string(b), `"httpAuthSecurityScheme":{`) {
		t.Fatalf("card: %d %s", st, b)
	}
	st, b := post("/a2a/echo", `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","contextId":"alice","role":"ROLE_USER","parts":[{"text":"x"}]},"configuration":{"returnImmediately":true}}}`, "alice")
	var resp struct {
		Result struct {
			Task struct {
				ID string `json:"id"`
			} `json:"task"`
		} `json:"result"`
	}
	if st != http.StatusOK || json.Unmarshal(b, &resp) != nil || resp.Result.Task.ID == "" {
		t.Fatalf("alice's A2A send: %d %s", st, b)
	}
	// The caller is recorded with each message, as on the native route.
	if st, _, b := e.do(t, http.MethodGet, "/agents/echo/alice/conversation", nil, bearer("alice")); st != http.StatusOK || strings.Count(string(b), `"principal"`) < 2 {
		t.Errorf("principal not recorded: %d %s", st, b)
	}
	a2aTokenCall(t, e, "garbage", `{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"`+resp.Result.Task.ID+`"}}`)
	for _, id := range []string{resp.Result.Task.ID, "sub_01M8SHQEJM6T5YC3TKXVK7R0GK"} {
		st, b := post("/a2a/echo", `{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"`+id+`"}}`, "bob")
		if st != http.StatusOK || !strings.Contains(string(b), `"code":-32001`) {
			t.Errorf("bob's GetTask of %s: %d %s", id, st, b)
		}
	}
	for _, tok := range []string{"reader", "alice"} {
		st, b := post("/a2a/echo", `{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"`+resp.Result.Task.ID+`"}}`, tok)
		if st != http.StatusOK || !strings.Contains(string(b), `"result"`) {
			t.Errorf("%s GetTask: %d %s", tok, st, b)
		}
	}
}

// a2aTokenCall posts as an unknown token: 401, whatever the method.
func a2aTokenCall(t *testing.T, e *env, tok, body string) {
	t.Helper()
	st, _, b := e.do(t, http.MethodPost, "/a2a/echo", strings.NewReader(body), map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + tok})
	if st != http.StatusUnauthorized {
		t.Errorf("unknown token: %d %s", st, b)
	}
}
