package transport_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/transport/console"
	"github.com/convlog/convlog/transport/jsclient"
)

func TestStaticFiles(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		path, contentType string
		want              []byte
	}{
		{"/console", "text/html; charset=utf-8", must(console.Files.ReadFile("index.html"))},
		{"/console/", "text/html; charset=utf-8", must(console.Files.ReadFile("index.html"))},
		{"/console/app.js", "text/javascript; charset=utf-8", must(console.Files.ReadFile("app.js"))},
		{"/console/style.css", "text/css; charset=utf-8", must(console.Files.ReadFile("style.css"))},
		{"/client/convlog.js", "text/javascript; charset=utf-8", must(jsclient.Files.ReadFile("convlog.js"))},
		{"/client/projection.js", "text/javascript; charset=utf-8", must(jsclient.Files.ReadFile("projection.js"))},
		{"/client/convlog.d.ts", "text/plain; charset=utf-8", must(jsclient.Files.ReadFile("convlog.d.ts"))},
	} {
		status, h, b := e.do(t, "GET", tc.path, nil, nil)
		if status != 200 || h.Get("Content-Type") != tc.contentType || string(b) != string(tc.want) {
			t.Errorf("GET %s: %d %q, %d bytes (want %d)", tc.path, status, h.Get("Content-Type"), len(b), len(tc.want))
		}
		if h.Get("Cache-Control") != "no-cache" {
			t.Errorf("GET %s: Cache-Control %q", tc.path, h.Get("Cache-Control"))
		}
	}
	for _, path := range []string{"/client/", "/client/nope.js", "/console/nope.js", "/console/../go.mod", "/client/test/client.test.js", "/client/jsclient.go"} {
		status, _, b := e.do(t, "GET", path, nil, nil)
		if eb := errorOf(t, b); status != 404 || eb["code"] != "not_found" {
			t.Errorf("GET %s: %d %s", path, status, b)
		}
	}
	if status, h, _ := e.do(t, "POST", "/console", strings.NewReader("{}"), map[string]string{"Content-Type": "application/json"}); status != 405 || h.Get("Allow") == "" {
		t.Errorf("POST /console: %d, Allow %q", status, h.Get("Allow"))
	}
}

// The console learns from routes.json which optional routes (rewind,
// listings...) this server has.
func TestConsoleRoutes(t *testing.T) {
	e := newEnv(t)
	status, _, b := e.do(t, "GET", "/console/routes.json", nil, nil)
	var got struct {
		Routes []struct{ Method, Path string }
	}
	if err := json.Unmarshal(b, &got); status != 200 || err != nil {
		t.Fatalf("routes.json: %d %v %s", status, err, b)
	}
	have := map[string]bool{}
	for _, r := range got.Routes {
		have[r.Method+" "+r.Path] = true
	}
	for _, want := range []string{"POST /agents/:name/:instanceId", "GET /agents/:name/:instanceId/stream", "GET /console"} {
		if !have[want] {
			t.Errorf("routes.json lacks %s: %s", want, b)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// With access control on, the console and the client load without a token
// (they hold no data); the API calls they make still need one.
func TestStaticFilesWithAccessControl(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"read:echo/*"}})
	e := newEnv(t, withAuth(a, auth.Limits{}))
	for _, path := range []string{"/console", "/console/app.js", "/console/routes.json", "/client/convlog.js"} {
		if status, _, b := e.do(t, "GET", path, nil, nil); status != 200 {
			t.Errorf("GET %s without a token: %d %s", path, status, b)
		}
	}
	if status, _, _ := e.do(t, "GET", "/agents/echo/i/conversation", nil, nil); status != 401 {
		t.Errorf("the API without a token: %d, want 401", status)
	}
}
