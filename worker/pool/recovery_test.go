package pool_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/natsbus"
)

// A process that died mid-turn left a running submission and an admitted
// one behind it. The next start settles the first failed "interrupted"
// without re-running it, then runs the second.
func TestRecoverySettlesInterruptedTurns(t *testing.T) {
	dir := t.TempDir()
	key := record.Key{Agent: "echo", Instance: "i", Session: "s"}
	db, err := clog.Open(filepath.Join(dir, "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	running, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userRecord("was running")}})
	if err != nil {
		t.Fatal(err)
	}
	waiting, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userRecord("was waiting")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: key, Start: []string{running.ID}, TurnID: "turn_dead"}); err != nil {
		t.Fatal(err)
	}
	// The outbox is published: only the log knows about the waiting one.
	if err := db.MarkPublished(ctx, running.ID, waiting.ID); err != nil {
		t.Fatal(err)
	}
	db.Close()

	r := startRigIn(t, dir, nil)
	got := r.settled(t, running.ID)
	if got.Status != record.StatusFailed || got.Error == nil || got.Error.Code != "interrupted" || !got.Error.Retryable {
		t.Fatalf("interrupted: %+v %+v", got, got.Error)
	}
	if got := r.settled(t, waiting.ID); got.Status != record.StatusCompleted {
		t.Fatalf("waiting: %+v", got)
	}
	// Exactly one settlement each, and the interrupted one has no reply.
	settlements := map[string]int{}
	for _, rec := range r.records(t, key) {
		if rec.Entry.Type == record.EntrySettlement {
			settlements[rec.Entry.SubmissionID]++
		}
		if rec.Entry.Type == record.EntryAssistantMessage && rec.Entry.SubmissionID == running.ID {
			t.Fatalf("interrupted submission was re-run: %+v", rec.Entry)
		}
	}
	if settlements[running.ID] != 1 || settlements[waiting.ID] != 1 {
		t.Fatalf("settlements %v", settlements)
	}
}

// admitMany admits n messages to key, concurrently so that they share
// commits, without ringing any doorbell.
func admitMany(t *testing.T, db *clog.DB, key record.Key, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	next := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				if _, _, err := db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord("backlog")}}); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// Issue 8 item 20: the sweep read only the first 10,000 unsettled
// submissions, so work whose doorbell was lost behind a larger backlog was
// never run. The pool here hears no doorbells at all: only its sweeps find
// work.
func TestSweepPagesPastBacklog(t *testing.T) {
	const ns = "deaf"
	r := startRigWith(t, t.TempDir(), nil, rigOptions{poolNamespace: ns, sweep: 50 * time.Millisecond, scanPage: 500})
	// A session another worker holds, with a backlog larger than the old
	// cap, ahead of the lost one in scan order.
	blocked := record.Key{Agent: "echo", Instance: "i", Session: "blocked"}
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(context.Background(), jetstream.KeyValueConfig{
		Bucket: ns + "_leases", TTL: natsbus.DefaultLeaseTTL, Storage: jetstream.FileStorage, History: 1,
		MaxBytes: natsbus.LeaseBucketMaxBytes, // as the pool makes it
	})
	if err != nil {
		t.Fatal(err)
	}
	renew := func() {
		if _, err := kv.Put(context.Background(), base64.RawURLEncoding.EncodeToString([]byte(blocked.String())), []byte("ins_other 01ARZ3NDEKTSV4RRFFQ69G5FAV")); err != nil {
			t.Fatal(err)
		}
	}
	renew()
	// The other worker stays alive for the whole test, however long the
	// machine takes to admit the backlog: it renews well within the TTL.
	stop, renewed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := kv.Put(context.Background(), base64.RawURLEncoding.EncodeToString([]byte(blocked.String())), []byte("ins_other 01ARZ3NDEKTSV4RRFFQ69G5FAV")); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	defer func() { close(stop); <-renewed }()
	admitMany(t, r.db, blocked, 10_001)
	lost := r.admit(t, record.Key{Agent: "echo", Instance: "i", Session: "lost"}, "found by a sweep")
	if s := r.settled(t, lost.ID); s.Status != record.StatusCompleted {
		t.Fatalf("%+v", s)
	}
	if s, _ := r.db.Pending(context.Background(), blocked); len(s) != 10_001 || s[0].Status != record.StatusAdmitted {
		t.Fatalf("the held session ran: %d pending", len(s))
	}
}

// Recovery pages through a backlog larger than a page: every session with
// admitted work is run, every orphan settled.
func TestRecoveryPagesBacklog(t *testing.T) {
	dir := t.TempDir()
	db, err := clog.Open(filepath.Join(dir, "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var waiting, orphans []record.Submission
	for i := range 25 {
		key := record.Key{Agent: "echo", Instance: "i", Session: fmt.Sprint("s", i)}
		run, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userRecord("was running")}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Write(ctx, clog.Write{Key: key, Start: []string{run.ID}, TurnID: "turn_dead"}); err != nil {
			t.Fatal(err)
		}
		w, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userRecord("was waiting")}})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.MarkPublished(ctx, run.ID, w.ID); err != nil {
			t.Fatal(err)
		}
		orphans, waiting = append(orphans, run), append(waiting, w)
	}
	db.Close()
	r := startRigWith(t, dir, nil, rigOptions{scanPage: 7, poolNamespace: "deaf", sweep: time.Hour})
	for _, s := range orphans {
		if got := r.settled(t, s.ID); got.Status != record.StatusFailed || got.Error.Code != "interrupted" {
			t.Fatalf("orphan %+v", got)
		}
	}
	for _, s := range waiting {
		if got := r.settled(t, s.ID); got.Status != record.StatusCompleted {
			t.Fatalf("waiting %+v", got)
		}
	}
}
