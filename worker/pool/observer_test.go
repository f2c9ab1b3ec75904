package pool_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/pool"
)

// observer records what the pool tells it.
type observer struct {
	mu    sync.Mutex
	turns []string // agent/outcome
	lost  int
}

func (o *observer) TurnEnded(agent string, outcome record.Outcome, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if d <= 0 {
		panic("a turn with no duration")
	}
	o.turns = append(o.turns, agent+"/"+string(outcome))
}

func (o *observer) LeaseLost() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lost++
}

func (o *observer) seen() ([]string, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.turns...), o.lost
}

// TestObserverSeesTurnsRunningAndLeaseLoss: a running turn counts in
// Running; its end reaches the observer with its agent and outcome; a
// lease taken from under a turn is one LeaseLost and a failed turn.
func TestObserverSeesTurnsRunningAndLeaseLoss(t *testing.T) {
	obs := &observer{}
	b := &blocker{started: make(chan string, 1), release: make(chan struct{})}
	r := startRigWith(t, t.TempDir(), func(reg *pool.Registry) { reg.Register("block", b, "") }, rigOptions{
		observer: obs,
		leaseTTL: 600 * time.Millisecond, // renewed every 200 ms
	})
	key := record.Key{Agent: "block", Instance: "i", Session: "s"}
	sub := r.admit(t, key, "one")
	<-b.started
	if turns, subs := r.pool.Running(); turns != 1 || subs != 1 {
		t.Fatalf("running %d turns, %d submissions; want 1 and 1", turns, subs)
	}
	b.release <- struct{}{}
	if got := r.settled(t, sub.ID); got.Status != record.StatusCompleted {
		t.Fatalf("settled %+v", got)
	}

	// Another holder takes the lease: the next renewal fails.
	sub = r.admit(t, key, "two")
	<-b.started
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), "convlog_leases")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), base64.RawURLEncoding.EncodeToString([]byte(key.String())), []byte("someone else")); err != nil {
		t.Fatal(err)
	}
	got := r.settled(t, sub.ID)
	if got.Status != record.StatusFailed || got.Error == nil || got.Error.Code != "lease_lost" {
		t.Fatalf("settled %+v %+v", got, got.Error)
	}
	// The settlement is committed just before the turn reports its end
	// and leaves the running set.
	check.For(t, 30*time.Second, 5*time.Millisecond, func() error {
		turns, lost := obs.seen()
		running, subs := r.pool.Running()
		if len(turns) == 2 && running == 0 && subs == 0 {
			if lost != 1 || turns[0] != "block/completed" || turns[1] != "block/failed" {
				t.Fatalf("observer saw turns %v, %d lease losses", turns, lost)
			}
			return nil
		}
		return fmt.Errorf("observer saw turns %v, %d lease losses; running %d/%d", turns, lost, running, subs)
	})
}
