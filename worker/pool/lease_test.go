package pool_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
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
	r := startRig(t, func(reg *pool.Registry) { reg.Register("o", agent, "") })
	second, err := pool.NewPool(pool.Config{Log: r.db, NATS: r.nc, Agents: r.agents, Deltas: r.bus, ShutdownTimeout: time.Second, SweepInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	defer func() { cancel(); <-done }()

	const sessions, perSession = 4, 30
	var subs []record.Submission
	for i := range perSession {
		for s := range sessions {
			subs = append(subs, r.admit(t, record.Key{Agent: "o", Instance: "i", Session: fmt.Sprint("s", s)}, fmt.Sprint(i)))
		}
	}
	for _, s := range subs {
		if got := r.settled(t, s.ID); got.Status != record.StatusCompleted {
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
	// A sweep every 50ms makes the pool retry the held session, so the
	// test can wait for refusals instead of sleeping.
	r := startRigWith(t, t.TempDir(), nil, rigOptions{sweep: 50 * time.Millisecond})
	key := record.Key{Agent: "echo", Instance: "i", Session: "held"}
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The pool may not have made the bucket yet; same config, same bucket.
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: "convlog_leases", TTL: natsbus.DefaultLeaseTTL, Storage: jetstream.FileStorage, History: 1,
		MaxBytes: natsbus.LeaseBucketMaxBytes, // as the pool makes it
	})
	if err != nil {
		t.Fatal(err)
	}
	leaseKey := base64.RawURLEncoding.EncodeToString([]byte(key.String()))
	if _, err := kv.Create(ctx, leaseKey, []byte("another-host 1 01ARZ3NDEKTSV4RRFFQ69G5FAV")); err != nil {
		t.Fatal(err)
	}
	// Each try to take the lease publishes to its KV subject, which a
	// plain subscriber sees whether or not the bucket takes the write.
	tries, err := r.nc.SubscribeSync("$KV.convlog_leases." + leaseKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sub := r.admit(t, key, "wait for me")
	// Three tries (the doorbell, then sweeps): the earlier ones have been
	// refused and acted on, so a pool that ran the turn anyway would have.
	for i := range 3 {
		_, err := tries.NextMsg(time.Minute)
		if s, _ := r.db.Submission(ctx, sub.ID); s.Status != record.StatusAdmitted {
			t.Fatalf("ran while another worker held the lease: %+v", s)
		}
		if err != nil {
			t.Fatalf("try %d to take the lease: %v", i+1, err)
		}
	}
	if err := tries.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	// The other worker finishes (or its lease lapses): the sweep or the
	// next doorbell runs the session.
	if err := kv.Delete(ctx, leaseKey); err != nil {
		t.Fatal(err)
	}
	r.relay.Kick()
	next := r.admit(t, key, "and me")
	if s := r.settled(t, sub.ID); s.Status != record.StatusCompleted {
		t.Fatalf("%+v", s)
	}
	if s := r.settled(t, next.ID); s.Status != record.StatusCompleted {
		t.Fatalf("%+v", s)
	}
}

// putLease writes a session lease as another worker would have.
func putLease(t *testing.T, r *rig, key record.Key, owner string) {
	t.Helper()
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The pool may not have made the bucket yet; same config, same bucket.
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: "convlog_leases", TTL: time.Hour, Storage: jetstream.FileStorage, History: 1,
		MaxBytes: natsbus.LeaseBucketMaxBytes, // as the pool makes it
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, base64.RawURLEncoding.EncodeToString([]byte(key.String())), []byte(owner)); err != nil {
		t.Fatal(err)
	}
}

// Issue 8 item 18: a lease of this data folder's previous process (same
// folder instance id, another boot) is taken over at once, whatever the
// pid: in a container convlog is pid 1 on every start.
func TestLeaseOfPredecessorTakenAtOnce(t *testing.T) {
	r := startRigWith(t, t.TempDir(), nil, rigOptions{leaseTTL: time.Hour})
	key := record.Key{Agent: "echo", Instance: "i", Session: "mine"}
	putLease(t, r, key, r.db.InstanceID()+" 01ARZ3NDEKTSV4RRFFQ69G5FAV")
	sub := r.admit(t, key, "after a restart")
	if s := r.settled(t, sub.ID); s.Status != record.StatusCompleted {
		t.Fatalf("%+v", s)
	}
}

// Issue 8 item 18: a lease of another worker is never taken before its TTL,
// even when it names this host and a pid that does not run here (a
// container sharing the hostname but not the pid namespace).
func TestLeaseOfSameHostnameNotTaken(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	key := record.Key{Agent: "echo", Instance: "i", Session: "peer"}
	pendings := make(chan struct{}, 100)
	var h *hookedLog
	r := startRigWith(t, t.TempDir(), nil, rigOptions{leaseTTL: time.Hour, sweep: 20 * time.Millisecond,
		wrap: func(l pool.Log) pool.Log { h = &hookedLog{Log: l}; return h }})
	h.mu.Lock()
	h.onPending = func(k record.Key) {
		if k == key {
			pendings <- struct{}{}
		}
	}
	h.mu.Unlock()
	for _, owner := range []string{
		host + " " + strconv.Itoa(gone.Process.Pid) + " 01ARZ3NDEKTSV4RRFFQ69G5FAV", // the old owner form
		"ins_01ARZ3NDEKTSV4RRFFQ69G5FAV 01BX5ZZKBKACTAV9WEVGEMMVRZ",                 // another folder
	} {
		t.Run(owner, func(t *testing.T) {
			for len(pendings) > 0 {
				<-pendings
			}
			putLease(t, r, key, owner)
			sub := r.admit(t, key, "not yet")
			// A runner's look at the session comes before its attempt at
			// the lease and after the previous runner's end: the second
			// look is after one attempt has come to its end.
			for range 2 {
				<-pendings
			}
			if s, _ := r.db.Submission(context.Background(), sub.ID); s.Status != record.StatusAdmitted {
				t.Fatalf("ran while another worker held the lease: %+v", s)
			}
			if _, err := r.pool.Abort(context.Background(), sub.ID); err != nil {
				t.Fatal(err)
			}
			js, _ := jetstream.New(r.nc)
			kv, _ := js.KeyValue(context.Background(), "convlog_leases")
			if err := kv.Delete(context.Background(), base64.RawURLEncoding.EncodeToString([]byte(key.String()))); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Issue 8 item 19: a pool of another data folder on the same namespace is
// refused, and the first goes on.
func TestNamespaceOfAnotherFolderRefused(t *testing.T) {
	r := startRig(t, nil)
	first := r.admit(t, record.Key{Agent: "echo", Instance: "i", Session: "s"}, "first")
	r.settled(t, first.ID) // the first pool holds the namespace
	other, err := clog.Open(filepath.Join(t.TempDir(), "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	second, err := pool.NewPool(pool.Config{Log: other, NATS: r.nc, Agents: r.agents, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = second.Run(context.Background())
	if !errors.Is(err, natsbus.ErrNamespaceInUse) || !strings.Contains(err.Error(), r.db.InstanceID()) {
		t.Fatalf("second folder's pool: %v", err)
	}
	next := r.admit(t, record.Key{Agent: "echo", Instance: "i", Session: "s"}, "still served")
	if s := r.settled(t, next.ID); s.Status != record.StatusCompleted {
		t.Fatalf("%+v", s)
	}
}
