package transport_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/wire"
)

// staticTokens makes an authenticator of static tokens: token -> scopes.
func staticTokens(t *testing.T, tokens map[string][]string) *auth.Authenticator {
	t.Helper()
	var cfg auth.Config
	for tok, scopes := range tokens {
		sum := sha256.Sum256([]byte(tok))
		cfg.Tokens = append(cfg.Tokens, auth.TokenConfig{SHA256: hex.EncodeToString(sum[:]), Principal: tok, Scopes: scopes})
	}
	a, err := auth.New(context.Background(), cfg, auth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

func withAuth(a transport.Authenticator, l auth.Limits) envOption {
	return func(o *envConfig) { o.Auth, o.Limits = a, l }
}

// The matrix: every principal against every route, on a conversation that
// exists (alice's) and on one that does not. A caller that may not do
// something gets the same status and body for both, and no response to it
// carries anything of alice's conversation.
func TestAccessMatrix(t *testing.T) {
	a := staticTokens(t, map[string][]string{
		"alice":    {"read:echo/{sub}", "deliver:echo/{sub}", "abort:echo/{sub}"},
		"bob":      {"read:echo/{sub}", "deliver:echo/{sub}", "abort:echo/{sub}"},
		"reader":   {"read:echo/*"},
		"ops":      {"admin", "read:*/*", "deliver:*/*", "abort:*/*", "manage:*/*", "approve:*/*"},
		"approver": {"approve:echo/*"},
		"nothing":  {},
		"otherapp": {"read:strict/*", "deliver:strict/*"},
	})
	// With an abort, so that its route is registered and in the matrix.
	e := newEnv(t, withAuth(a, auth.Limits{}), func(o *envConfig) {
		o.Abort = func(context.Context, string) (record.Submission, error) {
			return record.Submission{}, log.ErrSubmissionNotFound
		}
	})
	const secret = "the secret alice told the agent"
	st, _, body := e.do(t, http.MethodPost, "/agents/echo/alice", strings.NewReader(`{"message":"`+secret+`"}`),
		map[string]string{"Content-Type": "application/json", "Authorization": "Bearer alice"})
	if st != http.StatusAccepted {
		t.Fatalf("alice's delivery: %d %s", st, body)
	}
	subID := jsonField(t, body, "submissionId")

	type route struct {
		method, path, body string
		verb               auth.Verb
	}
	registered := map[string]bool{}
	for _, r := range e.srv.Routes() {
		registered[r.Method+" "+r.Path] = true
	}
	// Every route whose rule is a verb on a conversation, with its path
	// filled in for an instance and a submission.
	routes := func(instance, sub string) []route {
		var out []route
		for _, r := range transport.ConversationRoutes() {
			if !registered[r.Method+" "+r.Pattern] {
				continue
			}
			path := strings.NewReplacer(":name", "echo", ":instanceId", instance, ":submissionId", sub).Replace(r.Pattern)
			body := ""
			if r.Method == http.MethodPost {
				body = `{"message":"hi","entryId":"01AAAAAAAAAAAAAAAAAAAAAAAA"}`
				if strings.HasSuffix(path, "/"+instance) {
					body = `{"message":"hi"}`
				}
			}
			if r.Method == http.MethodGet {
				path += "?offset=0"
			}
			out = append(out, route{r.Method, path, body, r.Verb})
		}
		return out
	}
	allowed := map[string]map[auth.Verb]bool{ // on alice's conversation
		"alice":    {auth.VerbRead: true, auth.VerbDeliver: true, auth.VerbAbort: true},
		"reader":   {auth.VerbRead: true},
		"ops":      {auth.VerbRead: true, auth.VerbDeliver: true, auth.VerbAbort: true, auth.VerbManage: true, auth.VerbApprove: true},
		"approver": {auth.VerbApprove: true},
	}
	principals := []string{"", "garbage", "alice", "bob", "reader", "ops", "approver", "nothing", "otherapp"}
	cells, leaks := 0, 0
	for _, who := range principals {
		existing, missing := routes("alice", subID), routes("nobody-here", "sub_01AAAAAAAAAAAAAAAAAAAAAAAA")
		for i := range existing {
			cells++
			hdr := map[string]string{"Content-Type": "application/json"}
			if who != "" {
				hdr["Authorization"] = "Bearer " + who
			}
			if allowed[who][existing[i].verb] {
				continue // an allowed caller's answers are the other tests' business
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st1, body1 := doCtx(t, ctx, e, existing[i].method, existing[i].path, existing[i].body, hdr)
			st2, body2 := doCtx(t, ctx, e, missing[i].method, missing[i].path, missing[i].body, hdr)
			cancel()
			name := fmt.Sprintf("%q %s %s", who, existing[i].method, existing[i].path)
			want := http.StatusForbidden
			if who == "" || who == "garbage" {
				want = http.StatusUnauthorized
			}
			if st1 != want || st2 != want {
				t.Errorf("%s: %d (missing conversation: %d), want %d", name, st1, st2, want)
			}
			if string(body1) != string(body2) {
				t.Errorf("%s: an existing and a missing conversation answer differently:\n%s\n%s", name, body1, body2)
			}
			if strings.Contains(string(body1), secret) || strings.Contains(string(body1), subID) {
				leaks++
				t.Errorf("%s leaks alice's conversation: %s", name, body1)
			}
		}
	}
	if n := len(routes("", "")); n < 14 {
		t.Errorf("the matrix covers only %d routes", n)
	}
	t.Logf("access matrix: %d principals × %d routes = %d cells, %d leaks", len(principals), len(routes("", "")), cells, leaks)

	// Allowed callers get on with it.
	st, _, body = e.do(t, http.MethodGet, "/agents/echo/alice/conversation?offset=0", nil, map[string]string{"Authorization": "Bearer reader"})
	if st != http.StatusOK || !strings.Contains(string(body), secret) {
		t.Errorf("reader reading alice's conversation: %d %s", st, body)
	}
	if st, _, _ := e.do(t, http.MethodGet, "/healthz", nil, nil); st != http.StatusOK {
		t.Errorf("/healthz without a token: %d", st)
	}
}

func doCtx(t *testing.T, ctx context.Context, e *env, method, path, body string, hdr map[string]string) (int, []byte) {
	t.Helper()
	var rd *strings.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.ts.URL+path, nil)
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, e.ts.URL+path, rd)
	}
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if resp.StatusCode == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("%s %s: 401 without WWW-Authenticate", method, path)
	}
	return resp.StatusCode, []byte(b.String())
}

func TestDeliveryRateLimit(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"deliver:echo/*"}, "bob": {"deliver:echo/*"}})
	e := newEnv(t, withAuth(a, auth.Limits{DeliveriesPerSecond: 0.001, Burst: 2}))
	post := func(who string) (int, http.Header) {
		st, h, _ := e.do(t, http.MethodPost, "/agents/echo/i", strings.NewReader(`{"message":"x"}`),
			map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + who})
		return st, h
	}
	for i := range 2 {
		if st, _ := post("alice"); st != http.StatusAccepted {
			t.Fatalf("delivery %d within the burst: %d", i, st)
		}
	}
	st, h := post("alice")
	if st != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("over the burst: %d, Retry-After %q", st, h.Get("Retry-After"))
	}
	if st, _ := post("bob"); st != http.StatusAccepted {
		t.Errorf("another principal is limited by alice's bucket: %d", st)
	}
}

func TestStreamCap(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"read:echo/*"}})
	e := newEnv(t, withAuth(a, auth.Limits{Streams: 1}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+"/agents/echo/i/stream?offset=0", nil)
	req.Header.Set("Authorization", "Bearer alice")
	resp, err := e.ts.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	st, _, body := e.do(t, http.MethodGet, "/agents/echo/i/stream?offset=0", nil, map[string]string{"Authorization": "Bearer alice"})
	if st != http.StatusServiceUnavailable || !strings.Contains(string(body), wire.CodeTooManyStreams) {
		t.Fatalf("second stream over the cap: %d %s", st, body)
	}
	cancel()
	resp.Body.Close()
	// Once the first ends, a new one is allowed.
	check.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		req, _ := http.NewRequestWithContext(sctx, http.MethodGet, e.ts.URL+"/agents/echo/i/stream?offset=0", nil)
		req.Header.Set("Authorization", "Bearer alice")
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			return fmt.Errorf("the cap never freed: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the cap never freed: %d", resp.StatusCode)
		}
		return nil
	})
}

// jsonField is one top-level string field of a JSON object.
func jsonField(t *testing.T, body []byte, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	s, _ := m[name].(string)
	return s
}

// The caller is recorded on the user entry it delivered, and no client can
// write that field itself.
func TestPrincipalRecordedOnTheUserEntry(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"deliver:echo/*", "read:echo/*"}})
	e := newEnv(t, withAuth(a, auth.Limits{}))
	hdr := map[string]string{"Content-Type": "application/json", "Authorization": "Bearer alice"}
	st, _, body := e.do(t, http.MethodPost, "/agents/echo/i", strings.NewReader(`{"message":{"kind":"user","body":"hi","metadata":{"principal":{"subject":"mallory"}}}}`), hdr)
	if st != http.StatusBadRequest || !strings.Contains(string(body), "reserved") {
		t.Fatalf("a client-set principal: %d %s", st, body)
	}
	st, _, body = e.do(t, http.MethodPost, "/agents/echo/i", strings.NewReader(`{"message":{"kind":"user","body":"hi","metadata":{"client":"web"}}}`), hdr)
	if st != http.StatusAccepted {
		t.Fatalf("delivery: %d %s", st, body)
	}
	_, _, page := e.do(t, http.MethodGet, "/agents/echo/i/conversation?offset=0", nil, hdr)
	if !strings.Contains(string(page), `"metadata":{"client":"web","principal":{"subject":"alice"}}`) {
		t.Errorf("the user entry does not carry its principal: %s", page)
	}
	// Another principal reusing alice's idempotency key gets a 422, not her 202.
	b := staticTokens(t, map[string][]string{"alice": {"deliver:echo/*"}, "bob": {"deliver:echo/*"}})
	e2 := newEnv(t, withAuth(b, auth.Limits{}))
	send := func(who string) int {
		st, _, _ := e2.do(t, http.MethodPost, "/agents/echo/i", strings.NewReader(`{"message":"same"}`),
			map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + who, "Idempotency-Key": "k-1"})
		return st
	}
	if st := send("alice"); st != http.StatusAccepted {
		t.Fatalf("alice: %d", st)
	}
	if st := send("bob"); st != http.StatusUnprocessableEntity {
		t.Errorf("bob replaying alice's idempotency key: %d, want 422", st)
	}
}

// EventSource cannot send headers: it opens the stream with a short-lived,
// read-only stream token for one conversation, never the bearer token.
func TestStreamTokenOpensOneConversation(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"read:echo/*"}})
	e := newEnv(t, withAuth(a, auth.Limits{}))
	st, _, body := e.do(t, http.MethodPost, "/agents/echo/i/stream-token?session=s1", nil, map[string]string{"Authorization": "Bearer alice"})
	if st != http.StatusOK {
		t.Fatalf("stream-token: %d %s", st, body)
	}
	tok, streamURL := jsonField(t, body, "token"), jsonField(t, body, "streamUrl")
	if !strings.HasPrefix(tok, auth.StreamTokenPrefix) || !strings.Contains(streamURL, "access_token=") {
		t.Fatalf("stream-token body: %s", body)
	}
	open := func(path string) int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+path, nil)
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := open(streamURL + "&offset=0"); st != http.StatusOK {
		t.Errorf("stream with its token: %d", st)
	}
	for name, path := range map[string]string{
		"another session":         "/agents/echo/i/stream?session=s2&offset=0&access_token=" + tok,
		"another instance":        "/agents/echo/j/stream?session=s1&offset=0&access_token=" + tok,
		"the bearer in the URL":   "/agents/echo/i/stream?session=s1&offset=0&access_token=alice",
		"a forged token":          "/agents/echo/i/stream?session=s1&offset=0&access_token=" + tok[:len(tok)-2] + "xx",
		"a read of the JSON page": "/agents/echo/i/conversation?session=s1&offset=0&access_token=" + tok,
	} {
		if st := open(path); st != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, st)
		}
	}
}

// A stream outlives no token: when the one that opened it expires, the
// stream ends with an unauthorized error frame at the next heartbeat.
func TestStreamEndsWhenItsTokenExpires(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"read:echo/*"}})
	key := make([]byte, 32)
	st, err := auth.NewStreamTokens(key)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, withAuth(a, auth.Limits{}), func(o *envConfig) { o.StreamTokenKey = key; o.Heartbeat = 20 * time.Millisecond })
	tok, _ := st.Issue(auth.Principal{Subject: "alice"}, auth.Conversation{Agent: "echo", Instance: "i", Session: "default"}, time.Now(), 1100*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+"/agents/echo/i/stream?offset=0&access_token="+tok, nil)
	resp, err := e.ts.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("open: %v %v", resp, err)
	}
	defer resp.Body.Close()
	var all strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		all.Write(buf[:n])
		if err != nil {
			break // the server ended the stream
		}
	}
	if ctx.Err() != nil || !strings.Contains(all.String(), `"code":"unauthorized"`) {
		t.Fatalf("the stream did not end with an unauthorized frame (ctx %v):\n%s", ctx.Err(), all.String())
	}
}

// A stream token opens the messages view as SSE only: read as JSON, the
// view is an ordinary read, which needs a bearer token.
func TestStreamTokenMessagesJSON(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"read:echo/*"}})
	e := newEnv(t, withAuth(a, auth.Limits{}))
	st, _, b := e.postJSON(t, "/agents/echo/i/stream-token", "", map[string]string{"Authorization": "Bearer alice"})
	if st != http.StatusOK {
		t.Fatalf("stream token: %d %s", st, b)
	}
	var tok struct{ Token string }
	if err := json.Unmarshal(b, &tok); err != nil || tok.Token == "" {
		t.Fatalf("stream token: %v %s", err, b)
	}
	path := "/agents/echo/i/messages?access_token=" + url.QueryEscape(tok.Token)
	for _, accept := range []string{"", "application/json", "*/*"} {
		st, _, b := e.do(t, http.MethodGet, path, nil, map[string]string{"Accept": accept})
		if st != http.StatusUnauthorized {
			t.Errorf("Accept %q: a stream token read the JSON view: %d %s", accept, st, b)
		}
	}
	lb := openLive(t, e, http.MethodGet, path, "", map[string]string{"Accept": "text/event-stream"})
	if lb.resp.StatusCode != http.StatusOK {
		t.Fatalf("SSE with a stream token: %d", lb.resp.StatusCode)
	}
	lb.waitFor(t, "connected")
	lb.resp.Body.Close()
}

// The instance listing shows a caller only the instances it may read, and
// its cursors tell nothing of the others: they are filtered during the
// walk and sealed (once, a cursor was the base64 of the last row's name and
// activity time, whoever's it was).
func TestInstancesCursorOpaque(t *testing.T) {
	a := staticTokens(t, map[string][]string{
		"alice": {"read:echo/{sub}"},
		"admin": {"deliver:echo/*", "read:echo/*"},
	})
	e := newEnv(t, withAuth(a, auth.Limits{}))
	others := []string{"carol@corp.example", "dave"}
	for _, inst := range append([]string{"alice"}, others...) { // alice oldest
		if st, _, b := e.postJSON(t, "/agents/echo/"+inst, `{"message":"hi"}`, map[string]string{"Authorization": "Bearer admin"}); st != http.StatusAccepted {
			t.Fatalf("delivery to %s: %d %s", inst, st, b)
		}
	}
	var seen []string
	cursor := ""
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("the listing does not end")
		}
		path := "/agents/echo?limit=1"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		st, _, b := e.do(t, http.MethodGet, path, nil, map[string]string{"Authorization": "Bearer alice"})
		if st != http.StatusOK {
			t.Fatalf("%s: %d %s", path, st, b)
		}
		for _, o := range append(others, "alice") {
			if strings.Contains(string(b), o) && o != "alice" {
				t.Errorf("page %d names %s: %s", page, o, b)
			}
		}
		var res struct {
			Instances []struct {
				InstanceID string `json:"instanceId"`
			} `json:"instances"`
			NextCursor *string `json:"nextCursor"`
		}
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatal(err)
		}
		for _, in := range res.Instances {
			seen = append(seen, in.InstanceID)
		}
		if res.NextCursor == nil {
			break
		}
		cursor = *res.NextCursor
		raw, _ := base64.RawURLEncoding.DecodeString(cursor)
		for _, name := range append(others, "alice", "echo") {
			if strings.Contains(string(raw), name) {
				t.Errorf("cursor %q holds %q", cursor, name)
			}
		}
	}
	if fmt.Sprint(seen) != "[alice]" {
		t.Errorf("alice listed %v", seen)
	}
	// A cursor is bound to its agent and to this server.
	if st, _, b := e.do(t, http.MethodGet, "/agents/echo?cursor="+base64.RawURLEncoding.EncodeToString([]byte("echo\x00\x00\x00\x00\x00\x00\x00\x00\x01dave")), nil,
		map[string]string{"Authorization": "Bearer admin"}); st != http.StatusBadRequest || errorOf(t, b)["code"] != wire.CodeInvalidCursor {
		t.Errorf("a forged cursor: %d %s", st, b)
	}
}
