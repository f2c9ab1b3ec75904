// Package runnertest holds the contract test of conversation.Runner: one
// table run against both implementations, the local pool (worker/pool)
// and the remote workers' log owner (worker/remote), each started for
// real in the test's process with an embedded NATS. It is a package of its
// own because both implementations import package conversation.
package runnertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/internal/conversation"
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
	"github.com/convlog/convlog/worker/remote"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rig is a real log with a Runner running its turns.
type rig struct {
	db     *clog.DB
	relay  *natsbus.Relay
	runner conversation.Runner
	// claims: the runner may make fast-path offers (the pool does; the
	// remote owner, whose turns run elsewhere, never does).
	claims bool
}

const leaseTTL = 3 * time.Second

func registry(t *testing.T) *pool.Registry {
	t.Helper()
	agents := pool.NewRegistry()
	if err := agents.Register("echo", worker.Echo{}, ""); err != nil {
		t.Fatal(err)
	}
	return agents
}

// run runs fns until the test ends, then stops them and checks their
// errors.
func run(t *testing.T, fns ...func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, len(fns))
	for _, fn := range fns {
		go func() { done <- fn(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for range fns {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	})
}

func openLog(t *testing.T) *clog.DB {
	t.Helper()
	db, err := clog.Open(filepath.Join(t.TempDir(), "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

func startNATS(t *testing.T) *natsbus.Embedded {
	t.Helper()
	emb, err := natsbus.StartEmbedded(filepath.Join(t.TempDir(), "nats"), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	return emb
}

func connect(t *testing.T, emb *natsbus.Embedded) *nats.Conn {
	t.Helper()
	nc, err := emb.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// startPool is `serve` with its workers in process: the log, the relay
// and a pool.
func startPool(t *testing.T) *rig {
	t.Helper()
	db := openLog(t)
	emb := startNATS(t)
	nc := connect(t, emb)
	bus, err := natsbus.NewDeltaBus(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Close() })
	relay, err := natsbus.NewRelay(db, nc, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.NewPool(pool.Config{Log: db, NATS: nc, Agents: registry(t), Deltas: bus,
		ShutdownTimeout: time.Second, LeaseTTL: leaseTTL, SweepInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, relay.Run, p.Run)
	check.For(t, time.Minute, 10*time.Millisecond, p.Ready)
	return &rig{db: db, relay: relay, runner: p, claims: true}
}

// startRemote is `serve --workers=0` (the log, the relay and the remote
// server) with one remote worker on a connection of its own.
func startRemote(t *testing.T) *rig {
	t.Helper()
	db := openLog(t)
	emb := startNATS(t)
	nc := connect(t, emb)
	relay, err := natsbus.NewRelay(db, nc, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := remote.NewServer(remote.ServerConfig{Log: db, NATS: nc, LeaseTTL: leaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	run(t, relay.Run, srv.Run)
	check.For(t, time.Minute, 10*time.Millisecond, srv.Ready)

	wnc := connect(t, emb)
	c, err := remote.NewClient(remote.ClientConfig{NATS: wnc, RetryFor: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bus, err := natsbus.NewDeltaPublisher(wnc, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Close() })
	p, err := pool.NewPool(pool.Config{Log: c, NATS: wnc, Agents: registry(t), Deltas: bus, Remote: true,
		LeaseTTL: leaseTTL, SweepInterval: 200 * time.Millisecond, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	run(t, p.Run, func(ctx context.Context) error { return remote.ServeAborts(ctx, wnc, "", p) })
	check.For(t, time.Minute, 10*time.Millisecond, p.Ready)
	return &rig{db: db, relay: relay, runner: srv}
}

func userRecord(text string) record.Record {
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})
}

// admit admits a message and kicks the relay, as the core does.
func (r *rig) admit(t *testing.T, key record.Key, text string) record.Submission {
	t.Helper()
	sub, _, err := r.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord(text)}})
	if err != nil {
		t.Fatal(err)
	}
	r.relay.Kick()
	return sub
}

func (r *rig) sub(t *testing.T, id string) record.Submission {
	t.Helper()
	s, err := r.db.Submission(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitStatus waits until the submission has status want; a terminal
// status other than want fails at once.
func (r *rig) waitStatus(t *testing.T, id string, want record.Status) record.Submission {
	t.Helper()
	var s record.Submission
	check.For(t, 30*time.Second, 5*time.Millisecond, func() error {
		s = r.sub(t, id)
		if s.Status == want {
			return nil
		}
		if s.Status.Terminal() {
			t.Fatalf("submission %s settled %s, want %s: %+v", id, s.Status, want, s)
		}
		return fmt.Errorf("submission %s is %s, want %s", id, s.Status, want)
	})
	return s
}

// settlements are the settlement entries of key's current incarnation, by
// submission.
func (r *rig) settlements(t *testing.T, key record.Key) map[string][]record.Settlement {
	t.Helper()
	out := map[string][]record.Settlement{}
	off := record.Start
	for {
		res, err := r.db.Read(context.Background(), key, off, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range res.Batches {
			recs, err := b.Records.Decode()
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range recs {
				if rec.Kind == record.KindEntry && rec.Entry.Type == record.EntrySettlement {
					var st record.Settlement
					if err := json.Unmarshal(rec.Entry.Payload, &st); err != nil {
						t.Fatal(err)
					}
					out[st.SubmissionID] = append(out[st.SubmissionID], st)
				}
			}
		}
		off = res.NextOffset
		if res.UpToDate {
			return out
		}
	}
}

func (r *rig) settledOnce(t *testing.T, key record.Key, id string, outcome record.Outcome) {
	t.Helper()
	sts := r.settlements(t, key)[id]
	if len(sts) != 1 || sts[0].Outcome != outcome {
		t.Fatalf("submission %s: settlements %+v, want exactly one %s", id, sts, outcome)
	}
}

// stillAdmitted asserts that id does not start for a while: the absence
// of a start can only be watched for a bounded time.
func (r *rig) stillAdmitted(t *testing.T, id string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if s := r.sub(t, id); s.Status != record.StatusAdmitted {
			t.Fatalf("submission %s is %s while its session is quiesced", id, s.Status)
		}
	}
}

func timeout(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

const long = "/sleep 60s"

var contract = []struct {
	name string
	fn   func(t *testing.T, r *rig, key record.Key)
}{
	{"abort of a running turn settles it aborted once", func(t *testing.T, r *rig, key record.Key) {
		sub := r.admit(t, key, long)
		r.waitStatus(t, sub.ID, record.StatusRunning)
		got, err := r.runner.Abort(timeout(t), sub.ID)
		if err != nil || got.ID != sub.ID || got.Status != record.StatusAborted {
			t.Fatalf("Abort: %+v, %v; want it aborted", got, err)
		}
		r.settledOnce(t, key, sub.ID, record.OutcomeAborted)
		// A second abort changes nothing.
		if _, err := r.runner.Abort(timeout(t), sub.ID); !errors.Is(err, clog.ErrSubmissionSettled) {
			t.Fatalf("second Abort: %v, want ErrSubmissionSettled", err)
		}
		r.settledOnce(t, key, sub.ID, record.OutcomeAborted)
		// The session goes on.
		next := r.admit(t, key, "after")
		r.waitStatus(t, next.ID, record.StatusCompleted)
	}},
	{"abort of a waiting submission settles it at once", func(t *testing.T, r *rig, key record.Key) {
		running := r.admit(t, key, long)
		r.waitStatus(t, running.ID, record.StatusRunning)
		waiting := r.admit(t, key, "waiting")
		got, err := r.runner.Abort(timeout(t), waiting.ID)
		if err != nil || got.Status != record.StatusAborted {
			t.Fatalf("Abort: %+v, %v", got, err)
		}
		r.settledOnce(t, key, waiting.ID, record.OutcomeAborted)
		if s := r.sub(t, running.ID); s.Status != record.StatusRunning {
			t.Fatalf("the running turn: %+v", s)
		}
		if _, err := r.runner.Abort(timeout(t), running.ID); err != nil {
			t.Fatal(err)
		}
		r.settledOnce(t, key, running.ID, record.OutcomeAborted)
	}},
	{"quiesce aborts the running turn first and holds new starts", func(t *testing.T, r *rig, key record.Key) {
		running := r.admit(t, key, long)
		r.waitStatus(t, running.ID, record.StatusRunning)
		var held record.Submission
		ran := false
		err := r.runner.Quiesce(timeout(t), []record.Key{key}, true, func(ctx context.Context) error {
			ran = true
			// The running turn ended, aborted, before fn.
			if s := r.sub(t, running.ID); s.Status != record.StatusAborted {
				return fmt.Errorf("in fn, the running turn is %s", s.Status)
			}
			r.settledOnce(t, key, running.ID, record.OutcomeAborted)
			// A delivery meanwhile does not start until fn returns.
			held = r.admit(t, key, "held")
			r.stillAdmitted(t, held.ID, time.Second)
			return nil
		})
		if err != nil || !ran {
			t.Fatalf("Quiesce: %v (fn ran: %v)", err, ran)
		}
		r.waitStatus(t, held.ID, record.StatusCompleted)
		r.settledOnce(t, key, held.ID, record.OutcomeCompleted)
		r.settledOnce(t, key, running.ID, record.OutcomeAborted)
	}},
	{"quiesce without abortFirst leaves the running turn to fn", func(t *testing.T, r *rig, key record.Key) {
		running := r.admit(t, key, long)
		r.waitStatus(t, running.ID, record.StatusRunning)
		err := r.runner.Quiesce(timeout(t), []record.Key{key}, false, func(ctx context.Context) error {
			if s := r.sub(t, running.ID); s.Status != record.StatusRunning {
				return fmt.Errorf("in fn, the running turn is %s: aborted first", s.Status)
			}
			// What a reset does: it settles the running submission in
			// the new incarnation.
			_, _, err := r.db.Change(ctx, clog.Change{Kind: clog.ChangeReset, Key: key})
			return err
		})
		if err != nil {
			t.Fatalf("Quiesce: %v", err)
		}
		// The turn is stopped after fn: the session takes its next
		// message, and the stopped turn settles nothing more.
		next := r.admit(t, key, "after")
		r.waitStatus(t, next.ID, record.StatusCompleted)
		sts := r.settlements(t, key)
		if st := sts[running.ID]; len(st) != 1 || st[0].Outcome != record.OutcomeAborted || st[0].Error == nil || st[0].Error.Code != "stream_reset" {
			t.Fatalf("the reset turn's settlements %+v", st)
		}
		r.settledOnce(t, key, next.ID, record.OutcomeCompleted)
	}},
	{"fn's error is Quiesce's, and the session goes on", func(t *testing.T, r *rig, key record.Key) {
		boom := errors.New("boom")
		if err := r.runner.Quiesce(timeout(t), []record.Key{key}, true, func(context.Context) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("Quiesce: %v", err)
		}
		next := r.admit(t, key, "after")
		r.waitStatus(t, next.ID, record.StatusCompleted)
	}},
	{"claim is nil or started and released twice", func(t *testing.T, r *rig, key record.Key) {
		// The pool offers a claim while its runner lingers after a turn.
		claim := func() conversation.Claim {
			if !r.claims {
				return r.runner.Claim(key)
			}
			var c conversation.Claim
			for range 5 {
				warm := r.admit(t, key, "warm")
				r.waitStatus(t, warm.ID, record.StatusCompleted)
				for end := time.Now().Add(2 * time.Second); c == nil && time.Now().Before(end); time.Sleep(time.Millisecond) {
					c = r.runner.Claim(key)
				}
				if c != nil {
					return c
				}
			}
			t.Fatal("the pool made no offer while its session lingered, five times")
			return nil
		}
		c := claim()
		if c == nil {
			if r.claims {
				t.Fatal("no claim")
			}
			return
		}
		if c.TurnID() == "" {
			c.Release()
			t.Fatal("a claim with no turn id")
		}
		sub, _, err := r.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord("fast")}, StartTurn: c.TurnID()})
		if err != nil {
			c.Release()
			t.Fatal(err)
		}
		if sub.Status != record.StatusRunning || sub.TurnID != c.TurnID() {
			c.Release()
			t.Fatalf("admitted %+v, want running as %s", sub, c.TurnID())
		}
		c.Started(sub)
		c.Release()
		c.Release()
		got := r.waitStatus(t, sub.ID, record.StatusCompleted)
		if got.TurnID != c.TurnID() {
			t.Fatalf("ran as %s, claimed %s", got.TurnID, c.TurnID())
		}
		r.settledOnce(t, key, sub.ID, record.OutcomeCompleted)

		// A claim released unused, twice, leaves the session as it was.
		c = claim()
		c.Release()
		c.Release()
		next := r.admit(t, key, "after")
		r.waitStatus(t, next.ID, record.StatusCompleted)
		r.settledOnce(t, key, next.ID, record.OutcomeCompleted)
	}},
}

func TestRunnerContract(t *testing.T) {
	for _, impl := range []struct {
		name  string
		start func(*testing.T) *rig
	}{
		{"pool", startPool},
		{"remote", startRemote},
	} {
		t.Run(impl.name, func(t *testing.T) {
			r := impl.start(t)
			for i, tc := range contract {
				t.Run(tc.name, func(t *testing.T) {
					tc.fn(t, r, record.Key{Agent: "echo", Instance: "i", Session: fmt.Sprintf("s%d", i)})
				})
			}
		})
	}
}
