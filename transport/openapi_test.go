package transport_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// withEveryRoute turns on the optional routes.
func withEveryRoute(o *envConfig) {
	o.Abort = func(ctx context.Context, id string) (record.Submission, error) {
		return record.Submission{}, log.ErrSubmissionNotFound
	}
	o.Metrics = http.NotFoundHandler()
	o.Backup = backupFunc(func(ctx context.Context, begin func(int64) (io.Writer, error)) (int64, error) { return 0, nil })
}

var echoParam = regexp.MustCompile(`:([A-Za-z]+)`)

// TestOpenAPICoversRoutes: every route the server registers is in the
// document, with its method, and the document has no route the server
// lacks.
func TestOpenAPICoversRoutes(t *testing.T) {
	e := newEnv(t, withEveryRoute)
	status, _, body := e.do(t, http.MethodGet, "/openapi.json", nil, nil)
	if status != http.StatusOK {
		t.Fatalf("/openapi.json: %d", status)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("document: %v %q", err, doc.OpenAPI)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			if method != "parameters" && method != "summary" && method != "description" {
				documented[strings.ToUpper(method)+" "+path] = true
			}
		}
	}
	registered := map[string]bool{}
	for _, r := range e.srv.Routes() {
		if r.Method == "echo_route_not_found" || strings.HasSuffix(r.Path, "/*") {
			continue // echo's own catch-alls
		}
		if r.Method == http.MethodOptions {
			continue // CORS preflights: the middleware's
		}
		registered[r.Method+" "+echoParam.ReplaceAllString(r.Path, "{$1}")] = true
	}
	var missing, extra []string
	for r := range registered {
		if !documented[r] {
			missing = append(missing, r)
		}
	}
	for r := range documented {
		if !registered[r] {
			extra = append(extra, r)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("routes not in openapi.json: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("openapi.json routes the server does not register: %v", extra)
	}
	if len(registered) < 10 {
		t.Errorf("only %d routes registered: %v", len(registered), registered)
	}
}

// TestOpenAPIValid runs a real OpenAPI validator (@apidevtools/swagger-parser,
// pinned in testdata/openapi) over the document. Without Node or the
// package installed (npm ci in testdata/openapi) it skips, unless CI is
// set.
func TestOpenAPIValid(t *testing.T) {
	dir := filepath.Join("testdata", "openapi")
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "@apidevtools", "swagger-parser"))
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: the OpenAPI validator is not installed (node, and npm ci in %s): %v", dir, err)
		}
		t.Skipf("the OpenAPI validator is not installed (node, and npm ci in %s): %v", dir, err)
	}
	doc, err := filepath.Abs("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	samples := filepath.Join(t.TempDir(), "samples.json")
	if err := os.WriteFile(samples, responseSamples(t), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, "validate.mjs", doc, samples)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("validator: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "valid") || !strings.Contains(string(out), "match their schemas") {
		t.Fatalf("validator said: %s", out)
	}
}

// responseSamples are real bodies of a real server, named by the schema
// the document gives them.
func responseSamples(t *testing.T) []byte {
	e := newEnv(t)
	ctx := testCtx(t)
	type sample struct {
		Name   string          `json:"name"`
		Schema string          `json:"schema"`
		Body   json.RawMessage `json:"body"`
	}
	var out []sample
	add := func(name, schema, method, path, body string) {
		var status int
		var b []byte
		if method == http.MethodPost && body != "" {
			status, _, b = e.postJSON(t, path, body, nil)
		} else {
			status, _, b = e.do(t, method, path, nil, nil)
		}
		if status >= 500 || schema != "Error" && status >= 300 {
			t.Fatalf("%s: %d %s", name, status, b)
		}
		out = append(out, sample{name, schema, b})
	}
	add("202", "Accepted", http.MethodPost, "/agents/echo/doc", `{"message":{"kind":"user","body":"hello"},"session":"s"}`)
	var acc wire.Accepted
	if err := json.Unmarshal(out[0].Body, &acc); err != nil {
		t.Fatal(err)
	}
	key := record.Key{Agent: "echo", Instance: "doc", Session: "s"}
	if _, err := e.db.Write(ctx, log.Write{Key: key, Start: []string{acc.SubmissionID}, TurnID: "turn_1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Write(ctx, log.Write{Key: key, TurnID: "turn_1", Records: []record.Record{assistantText("hi")},
		Settle: []record.Settlement{{SubmissionID: acc.SubmissionID, Outcome: record.OutcomeFailed, Error: &record.Failure{Code: "boom", Message: "it broke"}}}}); err != nil {
		t.Fatal(err)
	}
	add("conversation", "ReadResult", http.MethodGet, "/agents/echo/doc/conversation?session=s", "")
	add("absent conversation", "ReadResult", http.MethodGet, "/agents/echo/nobody/conversation", "")
	add("submission", "Submission", http.MethodGet, "/agents/echo/doc/submissions/"+acc.SubmissionID, "")
	add("messages", "MessagesView", http.MethodGet, "/agents/echo/doc/messages?session=s", "")
	add("absent messages", "MessagesView", http.MethodGet, "/agents/echo/nobody/messages", "")
	inPlace := func(path, method, status string) string {
		esc := strings.NewReplacer("~", "~0", "/", "~1").Replace
		return "#/paths/" + esc(path) + "/" + method + "/responses/" + status + "/content/application~1json/schema"
	}
	add("instances", inPlace("/agents/{name}", "get", "200"), http.MethodGet, "/agents/echo", "")
	add("sessions", inPlace("/agents/{name}/{instanceId}/sessions", "get", "200"), http.MethodGet, "/agents/echo/doc/sessions", "")
	add("checkpoints", inPlace("/agents/{name}/{instanceId}/checkpoints", "get", "200"), http.MethodGet, "/agents/echo/doc/checkpoints?session=s", "")
	sub, err := e.db.Submission(ctx, acc.SubmissionID)
	if err != nil {
		t.Fatal(err)
	}
	add("fork", inPlace("/agents/{name}/{instanceId}/fork", "post", "201"), http.MethodPost, "/agents/echo/doc/fork?session=s",
		`{"entryId":"`+sub.EntryID+`"}`)
	add("reset", "ChangeResult", http.MethodPost, "/agents/echo/doc/reset", `{"session":"s"}`)
	add("delete", inPlace("/agents/{name}/{instanceId}", "delete", "200"), http.MethodDelete, "/agents/echo/doc", "")
	add("unknown offset", "Error", http.MethodGet, "/agents/echo/doc/conversation?offset=7", "")
	add("bad request", "Error", http.MethodPost, "/agents/echo/doc", `{"message":{}}`)
	add("not found", "Error", http.MethodGet, "/agents/nobody/doc/messages", "")
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
