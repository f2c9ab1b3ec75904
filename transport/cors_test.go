package transport_test

import (
	"net/http"
	"testing"

	"github.com/convlog/convlog/transport"
)

func TestCORS(t *testing.T) {
	e := newEnv(t, func(o *transport.Options) { o.CORSOrigins = []string{"https://chat.example"} })
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
