package transport_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// rawResponse reads one HTTP response from conn; the read deadline only
// turns a server that never answers into a failure.
func rawResponse(t testing.TB, conn net.Conn) (*http.Response, []byte) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("response body: %v", err)
	}
	return resp, b
}

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A body dribbled slower than BodyReadTimeout is answered 408
// request_timeout (JSON) and its connection closed; before, the handler
// waited for the rest for ever.
func TestBodyReadTimeout(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.BodyReadTimeout = 200 * time.Millisecond })
	conn := dial(t, e.ts.Listener.Addr().String())
	fmt.Fprintf(conn, "POST /agents/echo/i1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"message\":")
	resp, b := rawResponse(t, conn)
	if resp.StatusCode != http.StatusRequestTimeout || errorOf(t, b)["code"] != wire.CodeRequestTimeout {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if !resp.Close {
		t.Error("the connection stays open after a body that timed out")
	}
	e.waitIdle(t)
	if e.admitted.Load() != 0 {
		t.Fatal("admitted")
	}
}

// Request bodies in flight share one budget: over it a delivery is 503
// overloaded with Retry-After, and once the holders are gone it passes.
func TestBodyBudget(t *testing.T) {
	const maxBody = 64 << 10
	e := newEnv(t, func(o *envConfig) {
		o.MaxBody = maxBody
		o.BodyBudget = 100 << 10
	})
	addr := e.ts.Listener.Addr().String()
	body := `{"message":"` + strings.Repeat("b", 60_000) + `"}`

	// A body of known length that never finishes holds its length.
	holder := dial(t, addr)
	fmt.Fprintf(holder, "POST /agents/echo/i1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", len(body))
	waitFor(t, "the holder's handler", func() bool { return e.active.Load() == 1 })
	expectOverloaded(t, e, body)
	// Small deliveries still fit beside it.
	if status, _, b := e.postJSON(t, "/agents/echo/small", `{"message":"hi"}`, nil); status != http.StatusAccepted {
		t.Fatalf("small delivery: status %d: %s", status, b)
	}
	holder.Close()
	e.waitIdle(t)
	if status, _, b := e.postJSON(t, "/agents/echo/i1", body, nil); status != http.StatusAccepted {
		t.Fatalf("after the holder left: status %d: %s", status, b)
	}

	// A chunked body, of unknown length, holds what it has sent, reserved
	// in steps.
	chunked := dial(t, addr)
	fmt.Fprintf(chunked, "POST /agents/echo/i1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", 50_000, strings.Repeat(" ", 50_000))
	waitFor(t, "the chunked handler", func() bool { return e.active.Load() == 1 })
	expectOverloaded(t, e, body)
	chunked.Close()
	e.waitIdle(t)
	if status, _, b := e.postJSON(t, "/agents/echo/i1", body, nil); status != http.StatusAccepted {
		t.Fatalf("after the chunked holder left: status %d: %s", status, b)
	}
}

// expectOverloaded posts body until it is refused, which must be 503
// overloaded: the holder's bytes are reserved once its handler starts
// reading its body.
func expectOverloaded(t *testing.T, e *env, body string) {
	t.Helper()
	var status int
	var h http.Header
	var b []byte
	waitFor(t, "a 503 overloaded", func() bool {
		// A 202 is possible only before the holder's handler reserved.
		status, h, b = e.postJSON(t, "/agents/echo/over", body, nil)
		return status != http.StatusAccepted
	})
	if errorOf(t, b)["code"] != wire.CodeOverloaded || h.Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q: %s", status, h.Get("Retry-After"), b)
	}
}

// JSON pages being written share a budget too: with one large page held
// by a client that does not read, another large read is 503 overloaded
// with Retry-After, while a small one passes.
func TestPageBudget(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.PageBudget = 16 << 20 })
	ctx := testCtx(t)
	big := strings.Repeat("x", 4<<20)
	if _, err := e.db.Append(ctx, streamKey, userText(big), assistantText(big), assistantText(big)); err != nil {
		t.Fatal(err)
	}
	small := record.Key{Agent: "echo", Instance: "small", Session: "default"}
	if _, err := e.db.Append(ctx, small, userText("hi")); err != nil {
		t.Fatal(err)
	}
	conn := dialSmallBuffer(t, e.ts.Listener.Addr().String())
	defer conn.Close()
	fmt.Fprintf(conn, "GET /agents/echo/i1/conversation HTTP/1.1\r\nHost: x\r\n\r\n")
	// Its status line proves its handler reserved the page: the budget is
	// taken before the header is written. The rest it never reads.
	head := make([]byte, len("HTTP/1.1 200"))
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, head); err != nil || string(head) != "HTTP/1.1 200" {
		t.Fatalf("stalled page: %q %v", head, err)
	}
	status, h, b := e.do(t, http.MethodGet, "/agents/echo/i1/conversation", nil, nil)
	if status != http.StatusServiceUnavailable || errorOf(t, b)["code"] != wire.CodeOverloaded || h.Get("Retry-After") == "" {
		t.Fatalf("second large page: status %d: %.200s", status, b)
	}
	status, _, b = e.do(t, http.MethodGet, "/agents/echo/small/conversation", nil, nil)
	if status != http.StatusOK {
		t.Fatalf("small page: status %d: %s", status, b)
	}
	var page record.ReadResult
	if err := json.Unmarshal(b, &page); err != nil || len(page.Batches) != 1 {
		t.Fatalf("small page %s: %v", b, err)
	}
	conn.Close()
	e.waitIdle(t)
}

// A stream reads small pages (StreamPageBytes), so a stalled reader holds
// little; the stream is still complete and in order.
func TestStreamSmallPages(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.StreamPageBytes = 1024 })
	ctx := testCtx(t)
	var want []record.Offset
	for i := range 40 {
		a, err := e.db.Append(ctx, streamKey, userText(fmt.Sprintf("%03d %s", i, strings.Repeat("r", 200))))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, a.Offset)
	}
	r, err := e.c.Stream(ctx, "echo", "i1", "", record.Start)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i, w := range want {
		f := nextData(t, r)
		if f.BatchOffset != w || !strings.HasPrefix(textOf(t, f.Records[0]), fmt.Sprintf("%03d ", i)) {
			t.Fatalf("frame %d: %+v", i, f)
		}
	}
}
