package transport_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
)

// Over MaxStreams a stream is refused 503 too_many_streams with
// Retry-After and a closed connection, while deliveries and health checks
// still pass; a freed slot is taken again.
func TestMaxStreams(t *testing.T) {
	e := newEnv(t, func(o *transport.Options) { o.MaxStreams = 2 })
	ctx := testCtx(t)
	open := func(ctx context.Context) (*client.StreamReader, error) {
		r, err := e.c.Stream(ctx, "echo", "i1", "", log.Start)
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
	if status != http.StatusServiceUnavailable || errorOf(t, b)["code"] != transport.CodeTooManyStreams ||
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
