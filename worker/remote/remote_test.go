package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/convlog/convlog/internal/check"
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
	"github.com/convlog/convlog/worker/remote"
)

// owner is a log, an embedded NATS, the outbox relay and the remote
// server: `serve --workers=0`, in the test's process.
type owner struct {
	db    *clog.DB
	emb   *natsbus.Embedded
	nc    *nats.Conn
	relay *natsbus.Relay
	srv   *remote.Server
}

const testTTL = 3 * time.Second

func startOwner(t *testing.T) *owner {
	t.Helper()
	emb, err := natsbus.StartEmbedded(filepath.Join(t.TempDir(), "nats"), "")
	if err != nil {
		t.Fatal(err)
	}
	return startOwnerOn(t, emb)
}

// startOwnerOn is startOwner on a broker of the test's making, which it
// shuts down at the end.
func startOwnerOn(t *testing.T, emb *natsbus.Embedded) *owner {
	t.Helper()
	dir := t.TempDir()
	o := &owner{emb: emb}
	var err error
	if o.db, err = clog.Open(filepath.Join(dir, "log.db"), nil); err != nil {
		t.Fatal(err)
	}
	if o.nc, err = o.emb.Connect(); err != nil {
		t.Fatal(err)
	}
	if o.relay, err = natsbus.NewRelay(o.db, o.nc, "", nil); err != nil {
		t.Fatal(err)
	}
	if o.srv, err = remote.NewServer(remote.ServerConfig{Log: o.db, NATS: o.nc, LeaseTTL: testTTL}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- o.relay.Run(ctx) }()
	go func() { done <- o.srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
		o.nc.Close()
		o.emb.Shutdown()
		if err := o.db.Close(); err != nil {
			t.Error(err)
		}
	})
	waitFor(t, "the owner serving workers", func() bool { return o.srv.Ready() == nil })
	return o
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	check.For(t, time.Minute, 10*time.Millisecond, func() error {
		if !cond() {
			return errors.New("waiting for " + what)
		}
		return nil
	})
}

// startWorker runs a remote worker's pool on its own connection.
func startWorker(t *testing.T, o *owner) (*remote.Client, *pool.Pool) {
	t.Helper()
	return startWorkerSweeping(t, o, 200*time.Millisecond)
}

func startWorkerSweeping(t *testing.T, o *owner, sweep time.Duration) (*remote.Client, *pool.Pool) {
	t.Helper()
	return startWorkerOn(t, o, sweep, o.emb.Connect)
}

// client is a remote.Client of the owner's log on a connection of its own,
// closed at the test's end.
func (o *owner) client(t *testing.T) *remote.Client {
	t.Helper()
	nc, err := o.emb.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := remote.NewClient(remote.ClientConfig{NATS: nc})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func userRecord(text string) record.Record {
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})
}

func (o *owner) admit(t *testing.T, key record.Key, text string) record.Submission {
	t.Helper()
	sub, _, err := o.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord(text)}})
	if err != nil {
		t.Fatal(err)
	}
	o.relay.Kick()
	return sub
}

func (o *owner) settled(t *testing.T, id string) record.Submission {
	t.Helper()
	var sub record.Submission
	waitFor(t, "submission "+id+" to settle", func() bool {
		var err error
		sub, err = o.db.Submission(context.Background(), id)
		return err == nil && sub.Status.Terminal()
	})
	return sub
}

// entries reads a session's entries of one type.
func (o *owner) entries(t *testing.T, key record.Key, typ string) []record.Entry {
	t.Helper()
	res, err := o.db.Read(context.Background(), key, record.Start, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []record.Entry
	for _, b := range res.Batches {
		recs, err := b.Records.Decode()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Kind == record.KindEntry && r.Entry.Type == typ {
				out = append(out, *r.Entry)
			}
		}
	}
	return out
}

// Two remote workers answer every conversation of a log they do not hold:
// each submission completed once, with one echo, one turn at a time.
func TestRemoteWorkersAnswer(t *testing.T) {
	o := startOwner(t)
	startWorker(t, o)
	startWorker(t, o)
	var subs []record.Submission
	for i := range 12 {
		key := record.Key{Agent: "echo", Instance: "i", Session: []string{"a", "b", "c"}[i%3]}
		subs = append(subs, o.admit(t, key, "hello remote"))
	}
	for _, s := range subs {
		if got := o.settled(t, s.ID); got.Status != record.StatusCompleted {
			t.Fatalf("submission %s: %+v", s.ID, got)
		}
	}
	for _, sess := range []string{"a", "b", "c"} {
		key := record.Key{Agent: "echo", Instance: "i", Session: sess}
		settlements := o.entries(t, key, record.EntrySettlement)
		if len(settlements) != 4 {
			t.Fatalf("session %s: %d settlements, want 4", sess, len(settlements))
		}
		if replies := o.entries(t, key, record.EntryAssistantMessage); len(replies) == 0 {
			t.Fatalf("session %s: no reply", sess)
		}
	}
}

// holdLease takes a session's lease as a worker would, in the owner's
// bucket.
func holdLease(t *testing.T, o *owner, folder string, key record.Key) *natsbus.Lease {
	t.Helper()
	js, err := jetstream.New(o.nc)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := natsbus.OpenLeases(context.Background(), js, "", testTTL, folder)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ls.Acquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// A write whose reply was lost is retried as the same request; the owner
// stores it once and answers the retry as a success. The same holds for a
// retried start and a retried settlement.
func TestRetriedWriteStoredOnce(t *testing.T) {
	o := startOwner(t)
	c := o.client(t)
	key := record.Key{Agent: "echo", Instance: "i", Session: "retry"}
	sub, _, err := o.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord("x")}})
	if err != nil {
		t.Fatal(err)
	}
	l := holdLease(t, o, c.InstanceID(), key)
	f := pool.Fence{Lease: l.Owner(), Step: 1}
	ctx := context.Background()
	reply := record.EntryRecord(record.Entry{ID: "01JREPLYFIXEDID0000000000A", Type: record.EntryAssistantMessage, Payload: json.RawMessage(`{"parts":[]}`)})
	writes := []clog.Write{
		{Key: key, Start: []string{sub.ID}, TurnID: "turn_1"},
		{Key: key, TurnID: "turn_1", Records: []record.Record{reply}},
		{Key: key, TurnID: "turn_1", Settle: []record.Settlement{{SubmissionID: sub.ID, Outcome: record.OutcomeCompleted}}},
	}
	for i, w := range writes {
		f.Step = uint64(i + 1)
		for attempt := range 2 { // the second is the retry after a lost reply
			if _, err := c.WriteFenced(ctx, w, f); err != nil {
				t.Fatalf("write %d attempt %d: %v", i, attempt, err)
			}
		}
	}
	if n := len(o.entries(t, key, record.EntryAssistantMessage)); n != 1 {
		t.Fatalf("%d replies stored, want 1", n)
	}
	if n := len(o.entries(t, key, record.EntrySettlement)); n != 1 {
		t.Fatalf("%d settlements stored, want 1", n)
	}
	// A settlement that differs from the stored one is no replay.
	_, err = c.WriteFenced(ctx, clog.Write{Key: key, TurnID: "turn_1", Settle: []record.Settlement{{SubmissionID: sub.ID, Outcome: record.OutcomeAborted}}}, f)
	if !errors.Is(err, clog.ErrSubmissionSettled) {
		t.Fatalf("conflicting settlement: %v, want ErrSubmissionSettled", err)
	}
}

// A writer whose lease is gone or someone else's is refused, and nothing
// of its write is stored: the fenced writer.
func TestFencedWriteRefused(t *testing.T) {
	o := startOwner(t)
	c := o.client(t)
	key := record.Key{Agent: "echo", Instance: "i", Session: "fence"}
	sub, _, err := o.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord("x")}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := clog.Write{Key: key, Start: []string{sub.ID}, TurnID: "turn_stale"}
	// No lease at all (it lapsed).
	if _, err := c.WriteFenced(ctx, w, pool.Fence{Lease: "worker-dead nonce", Step: 1}); !errors.Is(err, remote.ErrFenced) {
		t.Fatalf("write without the lease: %v, want ErrFenced", err)
	}
	// Another worker's lease.
	holdLease(t, o, "worker-other", key)
	if _, err := c.WriteFenced(ctx, w, pool.Fence{Lease: "worker-dead nonce", Step: 1}); !errors.Is(err, remote.ErrFenced) {
		t.Fatalf("write under another's lease: %v, want ErrFenced", err)
	}
	got, err := o.db.Submission(ctx, sub.ID)
	if err != nil || got.Status != record.StatusAdmitted {
		t.Fatalf("submission after refused writes: %+v %v", got, err)
	}
}

// A worker that dies mid-turn (its pool gone, its lease left to lapse)
// leaves the turn to the other worker's sweep, which settles it failed
// interrupted, never re-run.
func TestDeadWorkerTurnSettledInterrupted(t *testing.T) {
	o := startOwner(t)
	nc, err := o.emb.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	dead, err := remote.NewClient(remote.ClientConfig{NATS: nc})
	if err != nil {
		t.Fatal(err)
	}
	key := record.Key{Agent: "echo", Instance: "i", Session: "dead"}
	sub, _, err := o.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord("x")}})
	if err != nil {
		t.Fatal(err)
	}
	// The dead worker started the turn under its lease and then vanished
	// (its lease is never renewed nor released).
	js, _ := jetstream.New(o.nc)
	ls, err := natsbus.OpenLeases(context.Background(), js, "", testTTL, dead.InstanceID())
	if err != nil {
		t.Fatal(err)
	}
	l, err := ls.Acquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dead.WriteFenced(context.Background(), clog.Write{Key: key, Start: []string{sub.ID}, TurnID: "turn_dead"}, pool.Fence{Lease: l.Owner(), Step: 1}); err != nil {
		t.Fatal(err)
	}
	// A live worker whose sweep comes by rarely, started while the dead
	// one's lease still holds (so its recovery leaves the turn be).
	startWorkerSweeping(t, o, 5*time.Second)
	waitFor(t, "the dead worker's lease to lapse", func() bool {
		h, err := ls.Holder(context.Background(), key)
		return err == nil && h == ""
	})
	// A message now: its doorbell makes the live worker take the free
	// lease, and its turn must not start before the dead turn is settled,
	// so that turns of one session follow one another in the log.
	next := o.admit(t, key, "after the dead one")
	got := o.settled(t, sub.ID)
	if n := o.settled(t, next.ID); n.Status != record.StatusCompleted {
		t.Fatalf("the next submission: %+v", n)
	}
	var order []string
	for _, e := range o.entries(t, key, record.EntrySettlement) {
		order = append(order, e.SubmissionID)
	}
	if len(order) != 2 || order[0] != sub.ID {
		t.Fatalf("settlements in order %v, want the dead turn's (%s) first", order, sub.ID)
	}
	if got.Status != record.StatusFailed || got.Error == nil || got.Error.Code != "interrupted" || got.TurnID != "turn_dead" {
		t.Fatalf("orphaned turn settled %+v", got)
	}
	for _, e := range o.entries(t, key, record.EntryAssistantMessage) {
		if e.SubmissionID == sub.ID {
			t.Fatalf("the orphaned submission was re-run: %+v", e)
		}
	}
	// The dead worker's late write is fenced off.
	if _, err := dead.WriteFenced(context.Background(), clog.Write{Key: key, TurnID: "turn_dead", Records: []record.Record{userRecord("late")}}, pool.Fence{Lease: l.Owner(), Step: 2}); !errors.Is(err, remote.ErrFenced) {
		t.Fatalf("late write of the dead worker: %v, want ErrFenced", err)
	}
}

// An abort through the owner reaches the remote worker running the turn,
// which cancels it and answers once it is settled aborted; an abort of a
// submission not started is settled by the owner itself.
func TestRemoteAbort(t *testing.T) {
	o := startOwner(t)
	startWorker(t, o)
	key := record.Key{Agent: "slow", Instance: "i", Session: "abort"}
	running := o.admit(t, key, "one two three four five six seven eight nine ten")
	queued := o.admit(t, key, "later")
	waitFor(t, "the turn to start", func() bool {
		s, err := o.db.Submission(context.Background(), running.ID)
		return err == nil && s.Status == record.StatusRunning
	})
	// The queued one may have joined the running turn; abort it only if
	// it is still waiting.
	if q, err := o.db.Submission(context.Background(), queued.ID); err == nil && q.Status == record.StatusAdmitted {
		got, err := o.srv.Abort(context.Background(), queued.ID)
		if err != nil || got.Status != record.StatusAborted {
			t.Fatalf("abort of a queued submission: %+v %v", got, err)
		}
	}
	got, err := o.srv.Abort(context.Background(), running.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != record.StatusAborted {
		t.Fatalf("abort of a running submission answered %+v", got)
	}
	if _, err := o.srv.Abort(context.Background(), running.ID); !errors.Is(err, clog.ErrSubmissionSettled) {
		t.Fatalf("second abort: %v, want ErrSubmissionSettled", err)
	}
}

// The owner answers a conversation's records, and takes writes to it, only
// from the holder of its session lease: a write that names no lease was
// once committed as it came, and any read was answered, to anyone on the
// broker.
func TestOwnerRefusesNonHolders(t *testing.T) {
	o := startOwner(t)
	c := o.client(t)
	key := record.Key{Agent: "echo", Instance: "i", Session: "holders"}
	sub, _, err := o.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord("secret")}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	forged := clog.Write{Key: key, TurnID: "turn_forged", Records: []record.Record{userRecord("forged")}}
	start := clog.Write{Key: key, Start: []string{sub.ID}, TurnID: "turn_forged"}
	cases := []struct {
		name   string
		holder string // who holds the session's lease; "" no one
		call   func() error
	}{
		{"unfenced write, no lease", "", func() error { _, err := c.Write(ctx, forged); return err }},
		{"unfenced start, another's lease", "worker-other", func() error { _, err := c.Write(ctx, start); return err }},
		{"write naming a lease it does not hold", "worker-other", func() error {
			_, err := c.WriteFenced(ctx, forged, pool.Fence{Lease: "worker-other " + "forged", Step: 1})
			return err
		}},
		{"read, no lease", "", func() error { _, err := c.Read(ctx, key, record.Start, 10); return err }},
		{"read, another's lease", "worker-other", func() error { _, err := c.Read(ctx, key, record.Start, 10); return err }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.holder != "" {
				l := holdLease(t, o, tc.holder, key)
				defer func() { _ = l.Release(context.Background()) }()
			}
			err := tc.call()
			if !errors.Is(err, remote.ErrNotLeaseHolder) {
				t.Fatalf("got %v, want ErrNotLeaseHolder", err)
			}
			if !strings.Contains(err.Error(), "lease") {
				t.Fatalf("the error does not say why: %v", err)
			}
		})
	}
	if n := len(o.entries(t, key, record.EntryUserMessage)); n != 1 {
		t.Fatalf("%d user entries after the refused writes, want 1", n)
	}
	if got, err := o.db.Submission(ctx, sub.ID); err != nil || got.Status != record.StatusAdmitted {
		t.Fatalf("submission after refused writes: %+v %v", got, err)
	}
	// The holder reads and writes.
	holdLease(t, o, c.InstanceID(), key)
	res, err := c.Read(ctx, key, record.Start, 10)
	if err != nil || len(res.Batches) == 0 {
		t.Fatalf("the holder's read: %+v %v", res, err)
	}
}

// A lifecycle change through the owner waits for the turns that workers
// run: with abortFirst, the running turn is aborted by its worker and
// settled before the change commits, so the change finds nothing running
// (before, `serve --workers=0` ran lifecycle changes beside running remote
// turns). After the change, the session's turns run again.
func TestQuiesceWaitsForRemoteTurns(t *testing.T) {
	o := startOwner(t)
	startWorker(t, o)
	ctx := context.Background()
	key := record.Key{Agent: "slow", Instance: "i", Session: "quiesce"}
	running := o.admit(t, key, "one two three four five six seven eight nine ten")
	waitFor(t, "the turn to start", func() bool {
		s, err := o.db.Submission(ctx, running.ID)
		return err == nil && s.Status == record.StatusRunning
	})
	err := o.srv.Quiesce(ctx, []record.Key{key}, true, func(ctx context.Context) error {
		s, err := o.db.Submission(ctx, running.ID)
		if err != nil {
			return err
		}
		if s.Status != record.StatusAborted {
			return fmt.Errorf("the change runs with the remote turn %s", s.Status)
		}
		_, err = o.db.Reset(ctx, key)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	after := o.admit(t, key, "after")
	if s := o.settled(t, after.ID); s.Status != record.StatusCompleted {
		t.Fatalf("a turn after the change: %+v", s)
	}
}
