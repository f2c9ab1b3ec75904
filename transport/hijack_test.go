package transport_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
)

// A stream owns its connection once its head is written: the request's
// handler has returned, the body is close-delimited (no chunked framing),
// and the stream ends, freeing its count, as soon as the client closes
// the socket, without waiting for a write to fail.
func TestStreamOwnsItsConnection(t *testing.T) {
	e := newEnv(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /agents/echo/i1/stream?offset=0 HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !resp.Close || len(resp.TransferEncoding) != 0 || resp.ContentLength != -1 {
		t.Fatalf("head: %d, close %v, transfer-encoding %v, length %d", resp.StatusCode, resp.Close, resp.TransferEncoding, resp.ContentLength)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" || resp.Header.Get("Date") == "" {
		t.Fatalf("headers %v", resp.Header)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != ": connected\n" {
		t.Fatalf("first line %q %v", line, err)
	}
	waitFor(t, "the handler to return while the stream stays", func() bool {
		return e.active.Load() == 0 && e.srv.OpenStreams() == 1
	})
	conn.Close()
	waitFor(t, "the stream to end with its client", func() bool { return e.srv.OpenStreams() == 0 })
}
