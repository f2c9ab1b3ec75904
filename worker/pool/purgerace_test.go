package pool_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
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
	key := record.Key{Agent: "slow", Instance: "i", Session: "s"}
	r.admit(t, key, "one")
	<-b.started
	if _, _, err := r.db.Change(context.Background(), clog.Change{Kind: clog.ChangeDelete, Key: key, Purge: true}); err != nil {
		t.Fatal(err)
	}
	b.release <- struct{}{}
	check.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		out := logs.String()
		if strings.Contains(out, "level=ERROR") {
			t.Fatalf("the turn did not end quietly:\n%s", out)
		}
		if !strings.Contains(out, "purged under a running turn") {
			return fmt.Errorf("the turn did not end quietly:\n%s", out)
		}
		return nil
	})
	r.stop()
	if out := logs.String(); strings.Contains(out, "level=ERROR") {
		t.Fatalf("an error was logged:\n%s", out)
	}
}
