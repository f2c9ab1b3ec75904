package worker_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/worker"
)

// overlapAgent fails the test's invariant if two turns of one session ever
// run at once, and records each session's prompts in order.
type overlapAgent struct {
	mu      sync.Mutex
	active  map[string]int
	overlap error
	order   map[string][]string
}

func (a *overlapAgent) Invoke(ctx context.Context, sc worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
	return func(yield func(worker.Event) bool) {
		a.mu.Lock()
		a.active[sc.Session]++
		if a.active[sc.Session] > 1 && a.overlap == nil {
			a.overlap = fmt.Errorf("two turns at once on %s", sc.Session)
		}
		a.order[sc.Session] = append(a.order[sc.Session], strings.Split(p.Text, "\n\n")...)
		a.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		a.mu.Lock()
		a.active[sc.Session]--
		a.mu.Unlock()
		yield(worker.Completed(nil))
	}
}

// Two pools consume the same stream in parallel, as two worker processes
// would: the lease keeps each session to one turn at a time, in order,
// each submission once.
func TestTwoPoolsNeverOverlap(t *testing.T) {
	agent := &overlapAgent{active: map[string]int{}, order: map[string][]string{}}
	r := startRig(t, func(reg *worker.Registry) { reg.Register("o", agent, "") })
	second, err := worker.NewPool(worker.Config{Log: r.db, NATS: r.nc, Agents: r.agents, Deltas: r.bus, ShutdownTimeout: time.Second, SweepInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	defer func() { cancel(); <-done }()

	const sessions, perSession = 4, 30
	var subs []clog.Submission
	for i := range perSession {
		for s := range sessions {
			subs = append(subs, r.admit(t, clog.Key{Agent: "o", Instance: "i", Session: fmt.Sprint("s", s)}, fmt.Sprint(i)))
		}
	}
	for _, s := range subs {
		if got := r.settled(t, s.ID); got.Status != clog.StatusCompleted {
			t.Fatalf("%+v", got)
		}
	}
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if agent.overlap != nil {
		t.Fatal(agent.overlap)
	}
	for s, seq := range agent.order {
		if len(seq) != perSession {
			t.Fatalf("%s: %d prompts (a submission ran twice or never): %v", s, len(seq), seq)
		}
		for i, v := range seq {
			if v != fmt.Sprint(i) {
				t.Fatalf("%s out of order: %v", s, seq)
			}
		}
	}
}

// A lease held by a live worker elsewhere keeps the session's turns off
// until it lapses.
func TestLeaseHeldElsewhereLapses(t *testing.T) {
	r := startRig(t, nil)
	key := clog.Key{Agent: "echo", Instance: "i", Session: "held"}
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The pool may not have made the bucket yet; same config, same bucket.
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: "convlog_leases", TTL: worker.DefaultLeaseTTL, Storage: jetstream.FileStorage, History: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	leaseKey := base64.RawURLEncoding.EncodeToString([]byte(key.String()))
	if _, err := kv.Create(ctx, leaseKey, []byte("another-host 1 01ARZ3NDEKTSV4RRFFQ69G5FAV")); err != nil {
		t.Fatal(err)
	}
	sub := r.admit(t, key, "wait for me")
	time.Sleep(300 * time.Millisecond)
	if s, _ := r.db.Submission(ctx, sub.ID); s.Status != clog.StatusAdmitted {
		t.Fatalf("ran while another worker held the lease: %+v", s)
	}
	// The other worker finishes (or its lease lapses): the sweep or the
	// next doorbell runs the session.
	if err := kv.Delete(ctx, leaseKey); err != nil {
		t.Fatal(err)
	}
	r.relay.Kick()
	next := r.admit(t, key, "and me")
	if s := r.settled(t, sub.ID); s.Status != clog.StatusCompleted {
		t.Fatalf("%+v", s)
	}
	if s := r.settled(t, next.ID); s.Status != clog.StatusCompleted {
		t.Fatalf("%+v", s)
	}
}
