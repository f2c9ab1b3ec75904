package transport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// agents is the test's agent table: name -> busy policy. An agent named
// "boom" panics, to exercise the Recover middleware.
type agents map[string]worker.BusyPolicy

func (a agents) Options(name string) (worker.AgentOptions, bool) {
	if name == "boom" {
		panic("the directory exploded")
	}
	p, ok := a[name]
	return worker.AgentOptions{Busy: p}, ok
}

// List is what GET /agents shows: set by withAgentList.
func (a agents) List() []worker.AgentInfo { return nil }

// listedAgents are agents whose GET /agents list is given.
type listedAgents struct {
	agents
	list []worker.AgentInfo
}

func (a listedAgents) List() []worker.AgentInfo { return a.list }

// testRunner is the Runner of a server without workers: no turn ever
// runs, so an abort settles the submission at once, as the pool does for
// one not yet started. Abort and Quiesce may be replaced by a test.
type testRunner struct {
	db      *log.DB
	abort   func(ctx context.Context, id string) (record.Submission, error)
	quiesce func(ctx context.Context, keys []record.Key, abortFirst bool, fn func(context.Context) error) error
}

func (r *testRunner) Claim(record.Key) conversation.Claim { return nil }

func (r *testRunner) Abort(ctx context.Context, id string) (record.Submission, error) {
	if r.abort != nil {
		return r.abort(ctx, id)
	}
	sub, err := r.db.Submission(ctx, id)
	if err != nil {
		return sub, err
	}
	if sub.Status.Terminal() {
		return sub, fmt.Errorf("abort %s: %w", id, log.ErrSubmissionSettled)
	}
	if _, err := r.db.Write(ctx, log.Write{Key: sub.Key, Settle: []record.Settlement{{SubmissionID: id, Outcome: record.OutcomeAborted,
		Error: &record.Failure{Code: "aborted", Message: "aborted before it ran"}}}}); err != nil {
		return sub, err
	}
	return r.db.Submission(ctx, id)
}

func (r *testRunner) Quiesce(ctx context.Context, keys []record.Key, abortFirst bool, fn func(context.Context) error) error {
	if r.quiesce != nil {
		return r.quiesce(ctx, keys, abortFirst, fn)
	}
	return fn(ctx)
}

// kicks counts the core's outbox kicks: one per durable admission.
type kicks struct{ n *atomic.Int64 }

func (k kicks) Kick() { k.n.Add(1) }

// newCore is a real conversation core over db, with the test's runner.
func newCore(t testing.TB, db *log.DB, ag conversation.Agents, r *testRunner, outbox conversation.Outbox) *conversation.Core {
	t.Helper()
	if r == nil {
		r = &testRunner{db: db}
	}
	core, err := conversation.New(conversation.Config{Log: db, Agents: ag, Runner: r, Outbox: outbox,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return core
}

// readyFunc and backupFunc make a function a Readiness or a Backuper.
type readyFunc func() error

func (f readyFunc) Ready() error { return f() }

type backupFunc func(ctx context.Context, begin func(int64) (io.Writer, error)) (int64, error)

func (f backupFunc) Backup(ctx context.Context, begin func(int64) (io.Writer, error)) (int64, error) {
	return f(ctx, begin)
}

// hub is the test's DeltaSource: tests publish frames to a key and every
// cursor on the key sees them. It keeps the last hubWindow frames per key,
// as a real source keeps a window.
type hub struct {
	mu      sync.Mutex
	streams map[record.Key]*hubStream
	fail    error // FollowDeltas fails with it when set
}

const hubWindow = 16

type hubStream struct {
	frames  [][]byte // the last hubWindow frames
	total   int      // frames ever published
	ready   chan struct{}
	cursors int
}

func newHub() *hub { return &hub{streams: map[record.Key]*hubStream{}} }

func (h *hub) FollowDeltas(key record.Key) (transport.DeltaCursor, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail != nil {
		return nil, h.fail
	}
	st := h.streams[key]
	if st == nil {
		st = &hubStream{ready: make(chan struct{})}
		h.streams[key] = st
	}
	st.cursors++
	return &hubCursor{h: h, st: st, seen: st.total}, nil
}

type hubCursor struct {
	h      *hub
	st     *hubStream
	seen   int
	closed bool
}

func (c *hubCursor) Ready() <-chan struct{} {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if c.st.total > c.seen {
		done := make(chan struct{})
		close(done)
		return done
	}
	return c.st.ready
}

func (c *hubCursor) Next(dst [][]byte) [][]byte {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	first := c.st.total - len(c.st.frames) // the total of the oldest kept
	from := max(c.seen, first)
	dst = append(dst, c.st.frames[from-first:]...)
	c.seen = c.st.total
	return dst
}

func (c *hubCursor) Close() {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.st.cursors--
	}
}

func (h *hub) publish(key record.Key, frame string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.streams[key]
	if st == nil {
		st = &hubStream{ready: make(chan struct{})}
		h.streams[key] = st
	}
	st.frames = append(st.frames, []byte(frame))
	if len(st.frames) > hubWindow {
		st.frames = st.frames[1:]
	}
	st.total++
	close(st.ready)
	st.ready = make(chan struct{})
}

func (h *hub) subscribers(key record.Key) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.streams[key]; st != nil {
		return st.cursors
	}
	return 0
}

// env is one server over a real log on loopback.
type env struct {
	db       *log.DB
	srv      *transport.Server
	ts       *httptest.Server
	c        *client.Client
	hub      *hub
	active   atomic.Int64 // requests inside the handler
	admitted atomic.Int64 // durable admissions (the core's outbox kicks)
}

// envConfig is what an envOption may change: the server's options, and
// the runner and agents of its conversation core.
type envConfig struct {
	transport.Options
	Agents     agents
	ListAgents []worker.AgentInfo
	// Abort and Quiesce replace the test runner's.
	Abort   func(ctx context.Context, id string) (record.Submission, error)
	Quiesce func(ctx context.Context, keys []record.Key, abortFirst bool, fn func(context.Context) error) error
}

type envOption func(*envConfig)

// newEnv starts a server with agents "echo" (enqueue) and "strict"
// (reject). Cleanup shuts the server down, then closes the log.
func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	return newEnvLog(t, nil, opts...)
}

// newEnvLog is newEnv with the log opened with logOpts.
func newEnvLog(t testing.TB, logOpts *log.Options, opts ...envOption) *env {
	t.Helper()
	db, err := log.Open(filepath.Join(t.TempDir(), "convlog.db"), logOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	e := &env{db: db, hub: newHub()}
	o := envConfig{Options: transport.Options{
		Log:     db,
		Deltas:  e.hub,
		MaxBody: 64 << 10,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, Agents: agents{"echo": worker.BusyJoin, "strict": worker.BusyReject, "plain": ""}}
	for _, opt := range opts {
		opt(&o)
	}
	o.Conversations = newCore(t, db, listedAgents{o.Agents, o.ListAgents},
		&testRunner{db: db, abort: o.Abort, quiesce: o.Quiesce}, kicks{&e.admitted})
	e.srv, err = transport.New(o.Options)
	if err != nil {
		t.Fatal(err)
	}
	h := e.srv.Handler()
	e.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.active.Add(1)
		defer e.active.Add(-1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(e.ts.Close)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	e.c = &client.Client{BaseURL: e.ts.URL, HTTP: e.ts.Client()}
	return e
}

// waitIdle waits until no request is inside the handler.
func (e *env) waitIdle(t testing.TB) {
	t.Helper()
	// A stream outlives its handler: it owns its connection.
	check.For(t, 30*time.Second, 5*time.Millisecond, func() error {
		if h, s := e.active.Load(), e.srv.OpenStreams(); h != 0 || s != 0 {
			return fmt.Errorf("%d handlers still running, %d streams open", h, s)
		}
		return nil
	})
}

// do sends a raw request and returns the status, headers and body.
func (e *env) do(t testing.TB, method, path string, body io.Reader, header map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.ts.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func (e *env) postJSON(t testing.TB, path, body string, header map[string]string) (int, http.Header, []byte) {
	t.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	for k, v := range header {
		h[k] = v
	}
	return e.do(t, http.MethodPost, path, strings.NewReader(body), h)
}

// errorOf decodes an error body, failing on any other shape.
func errorOf(t testing.TB, body []byte) map[string]any {
	t.Helper()
	var eb struct {
		Error map[string]any `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eb); err != nil || eb.Error == nil {
		t.Fatalf("not an error body (%v): %s", err, body)
	}
	return eb.Error
}

func userText(text string) record.Record {
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})
}

func assistantText(text string) record.Record {
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	return record.EntryRecord(record.Entry{Type: record.EntryAssistantMessage, Payload: p})
}

// textOf is the first text of a message record.
func textOf(t testing.TB, r record.Record) string {
	t.Helper()
	if r.Entry == nil {
		t.Fatalf("record %+v is not an entry", r)
	}
	var p record.MessagePayload
	if err := json.Unmarshal(r.Entry.Payload, &p); err != nil || len(p.Parts) == 0 {
		t.Fatalf("entry payload %s: %v", r.Entry.Payload, err)
	}
	return p.Parts[0].Text
}

// nextData skips comments and returns the next data frame.
func nextData(t testing.TB, r *client.StreamReader) client.Frame {
	t.Helper()
	for {
		f, err := r.Next()
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if f.Comment == "" {
			return f
		}
	}
}

// testCtx bounds a test's streams: a read that would hang fails instead.
// It is a safety net, not a speed check, so it is generous for a loaded
// 2-core machine.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var (
	reULIDish   = regexp.MustCompile(`\b(sub_|inc_)?[0-9A-HJKMNP-TV-Z]{26}\b`)
	reTimestamp = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
)

// normalize replaces generated ids and timestamps by stable placeholders,
// numbering ids in order of appearance so that references (parentId,
// submissionId) stay visible.
func normalize(b []byte) []byte {
	seen := map[string]string{}
	b = reULIDish.ReplaceAllFunc(b, func(m []byte) []byte {
		s := string(m)
		if r, ok := seen[s]; ok {
			return []byte(r)
		}
		prefix := "id_"
		if strings.HasPrefix(s, "sub_") || strings.HasPrefix(s, "inc_") {
			prefix = s[:4]
		}
		r := fmt.Sprintf("%s%d", prefix, len(seen)+1)
		seen[s] = r
		return []byte(r)
	})
	return reTimestamp.ReplaceAll(b, []byte("TIMESTAMP"))
}

// golden compares got, normalized, with testdata/name; -update rewrites it.
func golden(t testing.TB, name string, got []byte) {
	t.Helper()
	got = normalize(got)
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs:\n got: %s\nwant: %s", path, got, want)
	}
}

func asAPIError(err error, target **wire.APIError) bool { return errors.As(err, target) }
