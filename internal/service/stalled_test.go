package service

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/log/record"
)

// JSON readers that never read a large conversation are dropped by the
// write deadline, and what they held (their pages, their goroutines) is
// released: a stalled reader costs memory for WriteTimeout at most (issue
// 21: 60 such readers raised RSS by 170 MB, and it stayed). RSS itself may
// stay up after a burst, as the Go runtime returns freed pages to the OS
// lazily; the heap in use is what must come back.
func TestStalledJSONReadersAreDropped(t *testing.T) {
	const readers = 60
	svc, _ := testService(t, func(c *Config) { c.SSEWriteTimeout = 2 * time.Second })
	ctx := context.Background()
	key := record.Key{Agent: "echo", Instance: "big", Session: "default"}
	text := strings.Repeat("x", 60<<10)
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	for range 70 { // ~4 MiB
		if _, err := svc.db.Append(ctx, key, record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})); err != nil {
			t.Fatal(err)
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	baseGoroutines, baseHeap := runtime.NumGoroutine(), heap()

	var conns []*net.TCPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var d net.Dialer
	for range readers {
		nc, err := d.Dial("tcp", svc.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c := nc.(*net.TCPConn)
		_ = c.SetReadBuffer(4 << 10) // a small window, never read
		conns = append(conns, c)
		if _, err := fmt.Fprintf(c, "GET /agents/echo/big/conversation?offset=0&limit=1000 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	// They hold their pages while their writes block...
	var held uint64
	eventually(t, "the stalled readers hold their pages", func() bool {
		held = heap()
		return held > baseHeap+uint64(readers)<<20
	})
	// ...and lose them once the write deadline drops them, with the
	// sockets still open on our side.
	eventually(t, "the write deadline drops the stalled readers", func() bool {
		return runtime.NumGoroutine() <= baseGoroutines+5 && heap() < baseHeap+16<<20
	})
	// Bounded as well as released: the pages being written share the
	// PageBudget (256 MiB by default), beyond which a read is a 503.
	t.Logf("heap in use: %d MiB before, %d MiB with %d stalled readers, %d MiB after they were dropped; RSS now %s",
		baseHeap>>20, held>>20, readers, heap()>>20, rss())
}

// rss is this process's resident set, from /proc (for the log only).
func rss() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
