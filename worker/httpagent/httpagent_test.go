package httpagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agenttest"
	"github.com/convlog/convlog/worker/agentwire"
	"github.com/convlog/convlog/worker/httpagent"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPythonAgentConformance(t *testing.T) {
	a := &httpagent.Agent{URL: agenttest.StartHTTPAgent(t)}
	long := worker.Prompt{Text: "slow " + strings.Repeat("word ", 200)}
	agenttest.Run(t, a, agenttest.Options{
		Prompt:     worker.Prompt{Text: "hello world"},
		Long:       &long,
		Unknown:    &worker.Prompt{Text: "hello"},
		UnknownRaw: json.RawMessage(`{"type":"x-progress","pct":50}`),
	})
	evs, err := agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/b/c"}, worker.Prompt{Text: "fail now"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; last.Type != worker.EventFailed || last.Code != "asked_to_fail" {
		t.Fatalf("%+v", last)
	}
	evs, _ = agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/b/c"}, worker.Prompt{Text: "hi there"}, 30*time.Second)
	if last := evs[len(evs)-1]; last.Type != worker.EventCompleted || string(last.Data) != `{"session": "a/b/c"}` {
		t.Fatalf("%+v", last)
	}
}

// serve answers every POST with body as contentType, after checking the
// request's form.
func serve(t *testing.T, contentType, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req agentwire.Request
		if r.Header.Get("Content-Type") != "application/json" || !strings.Contains(r.Header.Get("Accept"), "application/x-ndjson") || json.NewDecoder(r.Body).Decode(&req) != nil || req.Prompt.Text != "ping" {
			http.Error(w, "bad request form", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", contentType)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func run(t *testing.T, url string) []worker.Event {
	t.Helper()
	evs, err := agenttest.Collect(context.Background(), &httpagent.Agent{URL: url}, worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "ping"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := agenttest.CheckTerminal(evs); err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestWireForms(t *testing.T) {
	t.Run("ndjson", func(t *testing.T) {
		evs := run(t, serve(t, "application/x-ndjson", "{\"type\":\"text\",\"delta\":\"a\"}\n\n{\"type\":\"completed\"}\n{\"type\":\"text\",\"delta\":\"ignored\"}\n"))
		if len(evs) != 2 || evs[0].Delta != "a" {
			t.Fatalf("%+v", evs)
		}
	})
	t.Run("sse", func(t *testing.T) {
		evs := run(t, serve(t, "text/event-stream; charset=utf-8", ": hi\n\nevent: x\ndata: {\"type\":\"text\",\ndata: \"delta\":\"a\"}\n\ndata: {\"type\":\"completed\"}\n\n"))
		if len(evs) != 2 || evs[0].Delta != "a" {
			t.Fatalf("%+v", evs)
		}
	})
	t.Run("no terminal", func(t *testing.T) {
		evs := run(t, serve(t, "application/x-ndjson", "{\"type\":\"text\",\"delta\":\"a\"}\n"))
		if last := evs[len(evs)-1]; last.Code != agentwire.CodeAgentProtocol || !last.Retryable {
			t.Fatalf("%+v", last)
		}
	})
	t.Run("malformed line", func(t *testing.T) {
		evs := run(t, serve(t, "application/x-ndjson", "{\"type\":\"text\",\"delta\":\"a\"}\n{\"type\":\"text\",\"delta\":\"b\"}\nnot json\n"))
		last := evs[len(evs)-1]
		if last.Code != agentwire.CodeAgentProtocol || !strings.Contains(last.Details, "line 3") || last.Retryable {
			t.Fatalf("%+v", last)
		}
	})
	t.Run("unknown relayed", func(t *testing.T) {
		evs := run(t, serve(t, "application/x-ndjson", "{\"type\":\"x-new\",\"payload\":[1,2]}\n{\"type\":\"completed\"}\n"))
		if evs[0].Type != "x-new" || string(evs[0].Raw) != `{"type":"x-new","payload":[1,2]}` {
			t.Fatalf("%+v", evs)
		}
	})
	t.Run("4xx", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no such model", http.StatusNotFound) }))
		defer srv.Close()
		last := run(t, srv.URL)[0]
		if last.Code != agentwire.CodeAgentRejected || last.Retryable || !strings.Contains(last.Details, "no such model") {
			t.Fatalf("%+v", last)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := fmt.Sprintf("http://%s/", ln.Addr())
		ln.Close()
		last := run(t, url)[0]
		if last.Code != agentwire.CodeAgentUnavailable || !last.Retryable {
			t.Fatalf("%+v", last)
		}
	})
}

// Cancelling closes the request: the server sees its context end.
func TestCancelClosesRequest(t *testing.T) {
	closed := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, "{\"type\":\"text\",\"delta\":\"a\"}\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(closed)
	}))
	defer srv.Close()
	if err := agenttest.CheckStop(&httpagent.Agent{URL: srv.URL}, worker.Scope{}, worker.Prompt{Text: "x"}, 2*time.Second, true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent's request stayed open")
	}
}

// listen serves h on a free port of ip (the whole of 127.0.0.0/8 is
// loopback on Linux: 127.0.0.2 is another host for the URL rules).
func listen(t *testing.T, ip string, h http.Handler) *httptest.Server {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// A redirect to another origin is not followed: the turn, its body and
// the agent's headers never reach the other host, and the turn fails
// egress_refused. A redirect within the origin still is.
func TestRedirects(t *testing.T) {
	var elsewhere atomic.Int32
	other := listen(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		t.Errorf("the other host got %s %s with X-Api-Key %q", r.Method, r.URL, r.Header.Get("X-Api-Key"))
	}))
	agent := listen(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/steal", http.StatusTemporaryRedirect)
		case "/moved":
			http.Redirect(w, r, "/invoke", http.StatusPermanentRedirect)
		case "/invoke":
			if r.Header.Get("X-Api-Key") != "k" {
				http.Error(w, "no key", http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, "{\"type\":\"completed\"}\n")
		}
	}))
	for _, tc := range []struct {
		path     string
		wantType string
		wantCode string
	}{
		{"/away", worker.EventFailed, "egress_refused"},
		{"/moved", worker.EventCompleted, ""},
	} {
		t.Run(tc.path, func(t *testing.T) {
			a := &httpagent.Agent{URL: agent.URL + tc.path, Headers: map[string]string{"X-Api-Key": "k"}}
			evs, err := agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "ping"}, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			last := evs[len(evs)-1]
			if last.Type != tc.wantType || last.Code != tc.wantCode || (tc.wantCode != "" && (last.Retryable || !strings.Contains(last.Details, "127.0.0.2"))) {
				t.Fatalf("%+v", last)
			}
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the other host got %d requests", n)
	}
}

// An agent URL at a metadata address is refused before any connection.
func TestMetadataRefused(t *testing.T) {
	evs, err := agenttest.Collect(context.Background(), &httpagent.Agent{URL: "http://169.254.169.254/latest/meta-data/"}, worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "ping"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; last.Type != worker.EventFailed || last.Code != "egress_refused" || last.Retryable || !strings.Contains(last.Details, "metadata") {
		t.Fatalf("%+v", last)
	}
}
