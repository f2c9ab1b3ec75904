package transport_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker"
)

// serveEnv runs the server with its own Serve on loopback, as convlog
// serve does (newEnv mounts only the Handler), and returns its address.
func serveEnv(t *testing.T) string {
	t.Helper()
	db, err := log.Open(filepath.Join(t.TempDir(), "convlog.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := transport.New(transport.Options{
		Log: db, Conversations: newCore(t, db, agents{"echo": worker.BusyJoin}, nil, nil),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}

// Requests that net/http refuses before any handler runs are answered
// with the API's JSON error and a 4xx, not text/plain, and never a 5xx
// (Transfer-Encoding: gzip was a 501).
func TestMalformedHTTPAnswersJSON(t *testing.T) {
	addr := serveEnv(t)
	const post = "POST /agents/echo/i1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	for _, tc := range []struct {
		name, req string
		status    int
		code      string
		message   string // a part of the message
	}{
		{"bad % escape in the path", "GET /agents/echo/i%zz/conversation HTTP/1.1\r\nHost: x\r\n\r\n",
			400, wire.CodeMalformedRequest, `invalid URL escape "%zz"`},
		{"bad % escape in the query", "GET /agents/echo/i1/conversation?session=%zz HTTP/1.1\r\nHost: x\r\n\r\n",
			400, wire.CodeMalformedRequest, "query string"},
		{"Content-Length not a number", post + "Content-Length: abc\r\n\r\n{}",
			400, wire.CodeMalformedRequest, `Content-Length "abc"`},
		{"two different Content-Lengths", post + "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
			400, wire.CodeMalformedRequest, "more than once"},
		{"no Host", "GET /healthz HTTP/1.1\r\n\r\n",
			400, wire.CodeMalformedRequest, "Host"},
		{"headers over the limit", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 80<<10) + "\r\n\r\n",
			431, wire.CodeHeadersTooLarge, "65536"},
		{"Transfer-Encoding gzip", post + "Transfer-Encoding: gzip\r\n\r\n",
			400, wire.CodeUnsupportedTransferEncoding, "Transfer-Encoding"},
		{"a bad request line", "GET\r\nHost: x\r\n\r\n",
			400, wire.CodeMalformedRequest, "not valid HTTP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := dial(t, addr)
			if _, err := io.WriteString(conn, tc.req); err != nil {
				t.Fatal(err)
			}
			resp, b := rawResponse(t, conn)
			mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
			if resp.StatusCode != tc.status || mt != "application/json" {
				t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			eb := errorOf(t, b)
			if eb["code"] != tc.code || !strings.Contains(fmt.Sprint(eb["message"]), tc.message) {
				t.Fatalf("error %v, want code %s and a message with %q", eb, tc.code, tc.message)
			}
		})
	}
	// Well-formed requests on the same listener are untouched.
	conn := dial(t, addr)
	io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, b := rawResponse(t, conn); resp.StatusCode != http.StatusOK || resp.Header.Get("Date") == "" {
		t.Fatalf("healthz: %d %v %s", resp.StatusCode, resp.Header, b)
	}
}
