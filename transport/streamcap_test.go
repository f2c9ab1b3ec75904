package transport_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

// Over MaxStreams a stream is refused 503 too_many_streams with
// Retry-After and a closed connection, while deliveries and health checks
// still pass; a freed slot is taken again.
func TestMaxStreams(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.MaxStreams = 2 })
	ctx := testCtx(t)
	open := func(ctx context.Context) (*client.StreamReader, error) {
		r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
		if err != nil {
			return nil, err
		}
		if f, err := r.Next(); err != nil || f.Comment != "connected" {
			t.Fatalf("first frame %+v %v", f, err)
		}
		return r, nil
	}
	r1, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	r2, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+"/agents/echo/i1/stream", nil)
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	status, h, b := resp.StatusCode, resp.Header, readAll(t, resp)
	if status != http.StatusServiceUnavailable || errorOf(t, b)["code"] != wire.CodeTooManyStreams ||
		h.Get("Retry-After") == "" || !resp.Close {
		t.Fatalf("third stream: status %d, headers %v: %s", status, h, b)
	}
	// The reserve: deliveries and health checks are not streams.
	if status, _, b := e.postJSON(t, "/agents/echo/i1", `{"message":"hi"}`, nil); status != http.StatusAccepted {
		t.Fatalf("delivery beside full streams: %d %s", status, b)
	}
	if status, _, b := e.do(t, http.MethodGet, "/healthz", nil, nil); status != http.StatusOK {
		t.Fatalf("healthz beside full streams: %d %s", status, b)
	}
	r1.Close()
	var r3 *client.StreamReader
	waitFor(t, "a freed stream slot", func() bool {
		r3, err = open(ctx)
		return err == nil
	})
	r3.Close()
}

func readAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b := make([]byte, 0, 512)
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			return b
		}
	}
}

// Every long-lived response counts against both stream caps, the server's
// MaxStreams and the principal's limit, and is refused 503
// too_many_streams beyond either, before it admits anything: the /messages
// view as SSE, the AI SDK chat and resume, AG-UI runs, A2A streaming and
// blocking sends. (Under a descriptor limit, 620 /messages streams once
// took every descriptor, the cap counting only /stream.)
func TestEveryLongResponseCapped(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"read:echo/*", "deliver:echo/*"}})
	caps := []struct {
		name string
		opt  envOption
		hdr  map[string]string
	}{
		{"max-streams", func(o *envConfig) { o.MaxStreams = 1 }, nil},
		{"per-principal", withAuth(a, auth.Limits{Streams: 1}), map[string]string{"Authorization": "Bearer alice"}},
	}
	a2aSend := func(method string, blocking bool) string {
		p := map[string]any{"message": a2aMessage("ctxA", "mA", "hi")}
		if !blocking {
			p["configuration"] = map[string]any{"returnImmediately": false}
		}
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": p})
		return string(b)
	}
	routes := []struct {
		name, method, path, body string
		accept                   string
		admits                   bool
	}{
		{"messages SSE", http.MethodGet, "/agents/echo/i1/messages", "", "text/event-stream", false},
		{"ai-sdk chat", http.MethodPost, "/ai-sdk/echo", aiSDKBody("chat1", "u1", "hi"), "", true},
		{"ai-sdk resume", http.MethodGet, "/ai-sdk/echo/pending/stream", "", "", false},
		{"ag-ui run", http.MethodPost, "/ag-ui/echo", `{"threadId":"t1","runId":"r1","messages":[{"id":"m1","role":"user","content":"hi"}]}`, "", true},
		{"a2a streaming", http.MethodPost, "/a2a/echo", a2aSend("SendStreamingMessage", false), "text/event-stream", true},
		{"a2a blocking send", http.MethodPost, "/a2a/echo", a2aSend("SendMessage", true), "", true},
	}
	for _, cp := range caps {
		t.Run(cp.name, func(t *testing.T) {
			e := newEnv(t, cp.opt)
			// A pending submission, for the resume to have something to serve.
			if st, _, b := e.postJSON(t, "/agents/echo/pending", `{"message":"wait"}`, cp.hdr); st != http.StatusAccepted {
				t.Fatalf("delivery: %d %s", st, b)
			}
			hold := openLive(t, e, http.MethodGet, "/agents/echo/i0/stream", "", cp.hdr)
			hold.waitFor(t, "connected")
			for _, r := range routes {
				before := e.admitted.Load()
				h := map[string]string{"Content-Type": "application/json"}
				for k, v := range cp.hdr {
					h[k] = v
				}
				if r.accept != "" {
					h["Accept"] = r.accept
				}
				var body io.Reader
				if r.body != "" {
					body = strings.NewReader(r.body)
				}
				// Bounded: a stream that opens must fail the test, not hang it.
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				req, _ := http.NewRequestWithContext(ctx, r.method, e.ts.URL+r.path, body)
				for k, v := range h {
					req.Header.Set(k, v)
				}
				resp, err := e.ts.Client().Do(req)
				if err != nil {
					cancel()
					t.Fatalf("%s: %v", r.name, err)
				}
				st, hd := resp.StatusCode, resp.Header
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				if st == http.StatusOK {
					t.Errorf("%s beyond the cap: opened", r.name)
					continue
				}
				if st != http.StatusServiceUnavailable || errorOf(t, b)["code"] != wire.CodeTooManyStreams || hd.Get("Retry-After") == "" {
					t.Errorf("%s beyond the cap: %d %v %s", r.name, st, hd, b)
				}
				if n := e.admitted.Load(); n != before {
					t.Errorf("%s: refused, but admitted %d", r.name, n-before)
				}
			}
			// A JSON read of the view is not a stream.
			if st, _, b := e.do(t, http.MethodGet, "/agents/echo/i1/messages", nil, cp.hdr); st != http.StatusOK {
				t.Errorf("messages JSON beside full streams: %d %s", st, b)
			}
			hold.resp.Body.Close()
		})
	}
}

// With access control on, a principal's streams are capped even when the
// limits name no cap.
func TestPrincipalStreamsDefault(t *testing.T) {
	a := staticTokens(t, map[string][]string{"alice": {"read:echo/*"}})
	for _, c := range []struct {
		set, want int
	}{{0, transport.DefaultPrincipalStreams}, {3, 3}} {
		e := newEnv(t, withAuth(a, auth.Limits{Streams: c.set}))
		if got := e.srv.PrincipalStreams(); got != c.want {
			t.Errorf("Streams %d: cap %d, want %d", c.set, got, c.want)
		}
	}
}
