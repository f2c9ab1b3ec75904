package natsbus

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log/record"
)

// flakyKV fails the next `failing` updates as a broker in a leader
// election does (a timeout), and can store an update while reporting it
// failed, as a lost ack does.
type flakyKV struct {
	jetstream.KeyValue
	failing  atomic.Int32
	lostAcks atomic.Int32
	updates  atomic.Int32
}

func (f *flakyKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	f.updates.Add(1)
	if f.failing.Add(-1) >= 0 {
		return 0, nats.ErrTimeout
	}
	if f.lostAcks.Add(-1) >= 0 {
		_, _ = f.KeyValue.Update(ctx, key, value, rev)
		return 0, nats.ErrTimeout
	}
	return f.KeyValue.Update(ctx, key, value, rev)
}

func testLeases(t *testing.T, ttl time.Duration) (*Leases, *flakyKV) {
	t.Helper()
	e, err := StartEmbedded(filepath.Join(t.TempDir(), "nats"), "")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close(); e.Shutdown() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	l, err := OpenLeases(context.Background(), js, "", ttl, "ins_test")
	if err != nil {
		t.Fatal(err)
	}
	f := &flakyKV{KeyValue: l.kv}
	l.kv = f
	return l, f
}

// Renewals that fail for a while (a leader election) are retried within
// the TTL; the turn is not stopped, and a renewal stored although its ack
// was lost does not count as the lease being taken.
func TestKeepRetriesWithinTTL(t *testing.T) {
	l, f := testLeases(t, 3*time.Second)
	ls, err := l.Acquire(context.Background(), record.Key{Agent: "a", Instance: "i", Session: "s"})
	if err != nil {
		t.Fatal(err)
	}
	f.failing.Store(3)  // each retry comes within 250ms: under a second of outage
	f.lostAcks.Store(1) // then one stored renewal whose ack is lost
	ctx, cancel := context.WithCancel(context.Background())
	var lost atomic.Value
	done := make(chan struct{})
	go func() { defer close(done); ls.Keep(ctx, func(err error) { lost.Store(err) }) }()
	check.For(t, time.Minute, 20*time.Millisecond, func() error {
		if n := f.updates.Load(); n < 8 && lost.Load() == nil {
			return fmt.Errorf("%d renewals, want 8", n)
		}
		return nil
	})
	cancel()
	<-done
	if err := lost.Load(); err != nil {
		t.Fatalf("lease given up through a short outage: %v", err)
	}
}

// Renewals failing for longer than the TTL give the lease up, before the
// broker would let another worker take it.
func TestKeepGivesUpAfterTTL(t *testing.T) {
	l, f := testLeases(t, 1500*time.Millisecond)
	ls, err := l.Acquire(context.Background(), record.Key{Agent: "a", Instance: "i", Session: "s"})
	if err != nil {
		t.Fatal(err)
	}
	f.failing.Store(1 << 30)
	lost := make(chan error, 1)
	ls.Keep(context.Background(), func(err error) { lost <- err })
	select {
	case err := <-lost:
		t.Logf("gave up: %v", err)
	default:
		t.Fatal("Keep returned without reporting the lease lost")
	}
}
