package transport_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
)

// A client that asks for a large JSON page and never reads it holds the
// server's handler (and the page's memory) only until the write deadline,
// as a stalled SSE reader does: before, it held them forever.
func TestPageReaderThatNeverReads(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.WriteTimeout = 300 * time.Millisecond })
	ctx := testCtx(t)
	// One batch of 12 MiB: more than loopback socket buffers hold.
	big := strings.Repeat("x", 4<<20)
	if _, err := e.db.Append(ctx, streamKey, userText(big), assistantText(big), assistantText(big)); err != nil {
		t.Fatal(err)
	}
	conn := dialSmallBuffer(t, e.ts.Listener.Addr().String())
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /agents/echo/i1/conversation HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	// The handler starts, blocks on the unread page, and must give up.
	waitFor(t, "the handler to start", func() bool { return e.active.Load() > 0 })
	e.waitIdle(t)
}

// waitFor is check.For for a condition that says nothing of what is
// wrong: what names it in the failure.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	check.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf("still waiting for %s", what)
	})
}
