package transport_test

import (
	"net/http"
	"os"
	"strings"
	"testing"
)

func TestCORS(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.CORSOrigins = []string{"https://chat.example"} })
	status, h, _ := e.do(t, http.MethodOptions, "/agents/echo/i1", nil, map[string]string{
		"Origin": "https://chat.example", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "content-type,idempotency-key",
	})
	if status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://chat.example" {
		t.Fatalf("preflight: %d %v", status, h)
	}
	status, h, _ = e.postJSON(t, "/agents/echo/i1", `{"message":"hi"}`, map[string]string{"Origin": "https://chat.example"})
	if status != http.StatusAccepted || h.Get("Access-Control-Allow-Origin") != "https://chat.example" || h.Get("Access-Control-Expose-Headers") == "" {
		t.Fatalf("post: %d %v", status, h)
	}
	// Another origin gets no grant.
	_, h, _ = e.postJSON(t, "/agents/echo/i1", `{"message":"hi"}`, map[string]string{"Origin": "https://evil.example"})
	if h.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin granted: %v", h)
	}
	// Without the option, no CORS headers at all.
	plain := newEnv(t)
	_, h, _ = plain.postJSON(t, "/agents/echo/i1", `{"message":"hi"}`, map[string]string{"Origin": "https://chat.example"})
	if h.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS without the option: %v", h)
	}
}

// docs/operations.md's CORS section names every method and request header
// the server allows, and every response header it exposes.
func TestCORSDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "For an allowed origin the server answers preflights")
	section, _, _ = strings.Cut(section, "\n## ")
	section = strings.Join(strings.Fields(section), " ")
	e := newEnv(t, func(o *envConfig) { o.CORSOrigins = []string{"https://chat.example"} })
	_, h, _ := e.do(t, http.MethodOptions, "/agents/echo/i1", nil, map[string]string{
		"Origin": "https://chat.example", "Access-Control-Request-Method": "POST",
	})
	_, post, _ := e.postJSON(t, "/agents/echo/i1", `{"message":"hi"}`, map[string]string{"Origin": "https://chat.example"})
	for _, c := range []struct{ header, value string }{
		{"Access-Control-Allow-Methods", h.Get("Access-Control-Allow-Methods")},
		{"Access-Control-Allow-Headers", h.Get("Access-Control-Allow-Headers")},
		{"Access-Control-Expose-Headers", post.Get("Access-Control-Expose-Headers")},
	} {
		if c.value == "" {
			t.Fatalf("no %s", c.header)
		}
		for _, v := range strings.Split(c.value, ",") {
			if !strings.Contains(section, "`"+strings.TrimSpace(v)+"`") {
				t.Errorf("%s: the server sends %q, which operations.md's CORS section does not name", c.header, v)
			}
		}
	}
}
