package pool_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/worker/pool"
)

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A delete with purge under a running turn is an expected race: the turn
// ends with nothing to settle, at debug level, not with
// "ERROR settle turn …: submission not found".
func TestPurgeRacingARunningTurnIsQuiet(t *testing.T) {
	var logs logBuf
	b := &blocker{started: make(chan string, 10), release: make(chan struct{})}
	r := startRigWith(t, t.TempDir(), func(reg *pool.Registry) { reg.Register("slow", b, "") },
		rigOptions{logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	key := clog.Key{Agent: "slow", Instance: "i", Session: "s"}
	r.admit(t, key, "one")
	<-b.started
	if _, _, err := r.db.Change(context.Background(), clog.Change{Kind: clog.ChangeDelete, Key: key, Purge: true}); err != nil {
		t.Fatal(err)
	}
	b.release <- struct{}{}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "purged under a running turn") {
		if strings.Contains(logs.String(), "level=ERROR") || time.Now().After(deadline) {
			t.Fatalf("the turn did not end quietly:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.stop()
	if out := logs.String(); strings.Contains(out, "level=ERROR") {
		t.Fatalf("an error was logged:\n%s", out)
	}
}
