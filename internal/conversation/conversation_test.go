package conversation_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
)

func TestNewRequiresLogAgentsAndRunner(t *testing.T) {
	db := openDB(t)
	full := conversation.Config{Log: db, Agents: agents{}, Runner: &fakeRunner{db: db}}
	for name, cfg := range map[string]conversation.Config{
		"no log":    {Agents: full.Agents, Runner: full.Runner},
		"no agents": {Log: full.Log, Runner: full.Runner},
		"no runner": {Log: full.Log, Agents: full.Agents},
	} {
		if _, err := conversation.New(cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := conversation.New(full); err != nil {
		t.Fatalf("outbox and logger are optional: %v", err)
	}
}

func TestAgentNormalisesBusyAndRefusesUnknown(t *testing.T) {
	r := newRig(t, agents{
		"default": {},
		"old":     {Busy: worker.BusyPolicy("enqueue")}, // the deprecated name
		"q":       {Busy: worker.BusyQueue, MaxTurns: 3},
		"i":       {Busy: worker.BusyInterrupt},
	})
	for name, want := range map[string]worker.BusyPolicy{
		"default": worker.BusyJoin, "old": worker.BusyJoin, "q": worker.BusyQueue, "i": worker.BusyInterrupt,
	} {
		o, err := r.core.Agent(name)
		if err != nil || o.Busy != want {
			t.Errorf("Agent(%q) = %+v, %v; want busy %s", name, o, err, want)
		}
	}
	if o, _ := r.core.Agent("q"); o.MaxTurns != 3 {
		t.Errorf("MaxTurns %d", o.MaxTurns)
	}
	if _, err := r.core.Agent("nosuch"); !errors.Is(err, conversation.ErrUnknownAgent) {
		t.Fatalf("unknown agent: %v", err)
	}
	if got := len(r.core.Agents()); got != 4 {
		t.Fatalf("Agents() lists %d", got)
	}

	// A delivery to an unknown agent stores nothing, asks the runner
	// nothing and relays nothing.
	r.runner.offer = true
	key := record.Key{Agent: "nosuch", Instance: "i", Session: "s"}
	if _, _, err := r.core.Admit(context.Background(), admission(key, "hi")); !errors.Is(err, conversation.ErrUnknownAgent) {
		t.Fatalf("admit to unknown agent: %v", err)
	}
	if ids := r.pendingIDs(t, key); len(ids) != 0 || len(r.runner.claimList()) != 0 || r.kicks.n.Load() != 0 {
		t.Fatalf("pending %v, claims %d, kicks %d", ids, len(r.runner.claimList()), r.kicks.n.Load())
	}
	// A regenerate names its agent too.
	if _, _, err := r.core.Change(context.Background(), log.Change{Kind: log.ChangeRegenerate, Key: key}); !errors.Is(err, conversation.ErrUnknownAgent) {
		t.Fatalf("regenerate of an unknown agent: %v", err)
	}
}

// Each busy policy's admission of a second delivery while the first runs
// (started on the fast path).
func TestAdmitBusyPolicies(t *testing.T) {
	for _, tc := range []struct {
		busy worker.BusyPolicy
		// wantErr is the second delivery's error; nil: admitted.
		wantErr error
		// firstAborted: the first submission is aborted by the second.
		firstAborted bool
	}{
		{busy: worker.BusyJoin},
		{busy: worker.BusyQueue},
		{busy: worker.BusyReject, wantErr: log.ErrSessionBusy},
		{busy: worker.BusyInterrupt, firstAborted: true},
	} {
		t.Run(string(tc.busy), func(t *testing.T) {
			r := newRig(t, agents{"a": {Busy: tc.busy}})
			r.runner.offer = true
			ctx := context.Background()
			key := record.Key{Agent: "a", Instance: "i", Session: "s"}
			first := r.admit(t, key, "first")
			if first.Status != record.StatusRunning {
				t.Fatalf("first delivery not started on the fast path: %+v", first)
			}
			second, _, err := r.core.Admit(ctx, admission(key, "second"))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("second delivery: %v, want %v", err, tc.wantErr)
				}
				if ids := r.pendingIDs(t, key); !slices.Equal(ids, []string{first.ID}) {
					t.Fatalf("pending %v: the refused delivery was stored", ids)
				}
				if n := r.kicks.n.Load(); n != 1 {
					t.Fatalf("%d kicks, want 1 (the refused delivery is not relayed)", n)
				}
				// Reject holds only while busy, and only this session.
				if _, _, err := r.core.Admit(ctx, admission(record.Key{Agent: "a", Instance: "i", Session: "other"}, "x")); err != nil {
					t.Fatalf("another session: %v", err)
				}
				if err := settle(ctx, r.db, r.sub(t, first.ID), record.OutcomeCompleted); err != nil {
					t.Fatal(err)
				}
				r.admit(t, key, "third")
				return
			}
			if err != nil {
				t.Fatalf("second delivery: %v", err)
			}
			if second.Status != record.StatusAdmitted {
				t.Fatalf("second delivery started while the session was busy: %+v", second)
			}
			// The second claim was offered, reported and released: the
			// admission did not start it.
			claims := r.runner.claimList()
			if len(claims) != 2 {
				t.Fatalf("%d claims", len(claims))
			}
			if started, releases := claims[1].state(); releases != 1 || len(started) != 1 || started[0].ID != second.ID || started[0].Status != record.StatusAdmitted {
				t.Fatalf("second claim: started %+v, %d releases", started, releases)
			}
			if n := r.kicks.n.Load(); n != 2 {
				t.Fatalf("%d kicks, want 2", n)
			}
			sts := settlements(t, r.db, key)
			if tc.firstAborted {
				if got := r.runner.abortCalls(); !slices.Equal(got, []string{first.ID}) {
					t.Fatalf("aborts %v, want the first only", got)
				}
				if s := r.sub(t, first.ID); s.Status != record.StatusAborted {
					t.Fatalf("first: %+v", s)
				}
				settledOnce(t, sts, first.ID, record.OutcomeAborted, "")
				if ids := r.pendingIDs(t, key); !slices.Equal(ids, []string{second.ID}) {
					t.Fatalf("pending %v, want the second only", ids)
				}
				return
			}
			if got := r.runner.abortCalls(); len(got) != 0 {
				t.Fatalf("aborts %v under %s", got, tc.busy)
			}
			if len(sts) != 0 {
				t.Fatalf("settlements %+v", sts)
			}
			if ids := r.pendingIDs(t, key); !slices.Equal(ids, []string{first.ID, second.ID}) {
				t.Fatalf("pending %v", ids)
			}
		})
	}
}

// Interrupt aborts the earlier submissions only (docs/protocol.md 6.2:
// "once every earlier unsettled submission of the session has been
// aborted"): a delivery admitted after this one, while this one is
// interrupting, is not aborted by it. Here the later delivery is admitted
// (and does its own interrupting) between the first's admission and its
// read of the pending submissions.
func TestAdmitInterruptAbortsOnlyEarlierSubmissions(t *testing.T) {
	r := newRig(t, agents{"a": {Busy: worker.BusyInterrupt}})
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	zero := r.admit(t, key, "zero")
	zero = startTurn(t, r.db, zero)
	var later record.Submission
	r.log.onPending = func(record.Key) {
		later = r.admit(t, key, "later")
	}
	first := r.admit(t, key, "first")
	if later.ID == "" {
		t.Fatal("the hook did not run")
	}
	for id, want := range map[string]record.Status{zero.ID: record.StatusAborted, first.ID: record.StatusAborted, later.ID: record.StatusAdmitted} {
		if s := r.sub(t, id); s.Status != want {
			t.Errorf("submission %s is %s, want %s", id, s.Status, want)
		}
	}
	if ids := r.pendingIDs(t, key); !slices.Equal(ids, []string{later.ID}) {
		t.Fatalf("pending %v, want the latest delivery only", ids)
	}
	sts := settlements(t, r.db, key)
	settledOnce(t, sts, zero.ID, record.OutcomeAborted, "")
	settledOnce(t, sts, first.ID, record.OutcomeAborted, "")
}

func TestAdmitMaxTurns(t *testing.T) {
	r := newRig(t, agents{"a": {Busy: worker.BusyQueue, MaxTurns: 2}})
	ctx := context.Background()
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	a := admission(key, "one")
	a.IdempotencyKey, a.RequestHash = "k1", "h1"
	one, _, err := r.core.Admit(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	two := r.admit(t, key, "two")
	for _, s := range []record.Submission{one, two} {
		if err := settle(ctx, r.db, s, record.OutcomeCompleted); err != nil {
			t.Fatal(err)
		}
	}
	kicked := r.kicks.n.Load()
	if _, _, err := r.core.Admit(ctx, admission(key, "three")); !errors.Is(err, log.ErrTurnLimit) {
		t.Fatalf("third delivery: %v, want ErrTurnLimit", err)
	}
	if n := r.kicks.n.Load(); n != kicked {
		t.Fatalf("a refused delivery was relayed (%d kicks, had %d)", n, kicked)
	}
	// A retry of an admitted request still gets its answer, and relays
	// nothing new.
	got, replayed, err := r.core.Admit(ctx, a)
	if err != nil || !replayed || got.ID != one.ID {
		t.Fatalf("replay: %+v %v %v", got, replayed, err)
	}
	if n := r.kicks.n.Load(); n != kicked {
		t.Fatalf("a replay was relayed")
	}
	// A regenerate is a turn too.
	if _, _, err := r.core.Change(ctx, log.Change{Kind: log.ChangeRegenerate, Key: key}); !errors.Is(err, log.ErrTurnLimit) {
		t.Fatalf("regenerate past the limit: %v", err)
	}
	// The limit is per session.
	r.admit(t, record.Key{Agent: "a", Instance: "i", Session: "t"}, "elsewhere")
	// A reset starts the count again.
	if _, _, err := r.core.Change(ctx, log.Change{Kind: log.ChangeReset, Key: key}); err != nil {
		t.Fatal(err)
	}
	r.admit(t, key, "after reset")
}

func TestAdmitFastPath(t *testing.T) {
	ctx := context.Background()
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	t.Run("offered", func(t *testing.T) {
		r := newRig(t, agents{"a": {}})
		r.runner.offer = true
		sub := r.admit(t, key, "hi")
		claims := r.runner.claimList()
		if len(claims) != 1 {
			t.Fatalf("%d claims", len(claims))
		}
		if sub.Status != record.StatusRunning || sub.TurnID != claims[0].turnID {
			t.Fatalf("admitted %+v, want running as %s", sub, claims[0].turnID)
		}
		started, releases := claims[0].state()
		if len(started) != 1 || started[0].ID != sub.ID || started[0].TurnID != claims[0].turnID || releases != 1 {
			t.Fatalf("claim: started %+v, %d releases", started, releases)
		}
		if stored := r.sub(t, sub.ID); stored.Status != record.StatusRunning || stored.TurnID != claims[0].turnID {
			t.Fatalf("stored %+v", stored)
		}
		// The admission is relayed as any other.
		if n := r.kicks.n.Load(); n != 1 {
			t.Fatalf("%d kicks", n)
		}
	})
	t.Run("not offered", func(t *testing.T) {
		r := newRig(t, agents{"a": {}})
		sub := r.admit(t, key, "hi")
		if sub.Status != record.StatusAdmitted || sub.TurnID != "" {
			t.Fatalf("admitted %+v", sub)
		}
		if n := r.kicks.n.Load(); n != 1 {
			t.Fatalf("%d kicks, want 1", n)
		}
	})
	t.Run("refused admission releases", func(t *testing.T) {
		r := newRig(t, agents{"a": {Busy: worker.BusyReject}})
		r.admit(t, key, "first")
		r.runner.offer = true
		if _, _, err := r.core.Admit(ctx, admission(key, "second")); !errors.Is(err, log.ErrSessionBusy) {
			t.Fatal(err)
		}
		claims := r.runner.claimList()
		if started, releases := claims[0].state(); len(started) != 0 || releases != 1 {
			t.Fatalf("claim of a refused admission: started %+v, %d releases", started, releases)
		}
	})
	t.Run("replay releases", func(t *testing.T) {
		r := newRig(t, agents{"a": {}})
		a := admission(key, "hi")
		a.IdempotencyKey, a.RequestHash = "k", "h"
		first, _, err := r.core.Admit(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		r.runner.offer = true
		got, replayed, err := r.core.Admit(ctx, a)
		if err != nil || !replayed || got.ID != first.ID || got.Status != record.StatusAdmitted {
			t.Fatalf("replay %+v %v %v", got, replayed, err)
		}
		claims := r.runner.claimList()
		if started, releases := claims[0].state(); len(started) != 0 || releases != 1 {
			t.Fatalf("claim of a replay: started %+v, %d releases", started, releases)
		}
		if n := r.kicks.n.Load(); n != 1 {
			t.Fatalf("%d kicks, want 1", n)
		}
	})
	t.Run("no outbox", func(t *testing.T) {
		db := openDB(t)
		core, err := conversation.New(conversation.Config{Log: db, Agents: agents{"a": {}}, Runner: &fakeRunner{db: db}})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := core.Admit(ctx, admission(key, "hi")); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAbort(t *testing.T) {
	ctx := context.Background()
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	for _, tc := range []struct {
		name string
		// prepare makes the submission's state before the abort.
		prepare func(t *testing.T, r *rig, sub record.Submission)
		finish  record.Outcome // the runner's: the turn settles so first
		// want is the status after; settledErr: the abort is refused
		// with a *SettledError of that status; settled: with an error
		// wrapping log.ErrSubmissionSettled.
		want       record.Status
		settledErr bool
		settled    bool
	}{
		{name: "admitted", want: record.StatusAborted},
		{name: "running", prepare: func(t *testing.T, r *rig, sub record.Submission) { startTurn(t, r.db, sub) }, want: record.StatusAborted},
		{name: "running, completes first", prepare: func(t *testing.T, r *rig, sub record.Submission) { startTurn(t, r.db, sub) },
			finish: record.OutcomeCompleted, want: record.StatusCompleted, settledErr: true},
		{name: "running, fails first", prepare: func(t *testing.T, r *rig, sub record.Submission) { startTurn(t, r.db, sub) },
			finish: record.OutcomeFailed, want: record.StatusFailed, settledErr: true},
		{name: "settled already", prepare: func(t *testing.T, r *rig, sub record.Submission) {
			if err := settle(ctx, r.db, sub, record.OutcomeCompleted); err != nil {
				t.Fatal(err)
			}
		}, want: record.StatusCompleted, settled: true},
		{name: "aborted already", prepare: func(t *testing.T, r *rig, sub record.Submission) {
			if err := settle(ctx, r.db, sub, record.OutcomeAborted); err != nil {
				t.Fatal(err)
			}
		}, want: record.StatusAborted, settled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, agents{"a": {}})
			r.runner.finish = tc.finish
			sub := r.admit(t, key, "hi")
			if tc.prepare != nil {
				tc.prepare(t, r, sub)
			}
			got, err := r.core.Abort(ctx, sub.ID)
			var se *conversation.SettledError
			switch {
			case tc.settledErr:
				if !errors.As(err, &se) || se.Status != tc.want || !errors.Is(err, log.ErrSubmissionSettled) {
					t.Fatalf("abort: %v (%T), want a *SettledError %s wrapping ErrSubmissionSettled", err, err, tc.want)
				}
			case tc.settled:
				if !errors.Is(err, log.ErrSubmissionSettled) {
					t.Fatalf("abort: %v, want ErrSubmissionSettled", err)
				}
			default:
				if err != nil {
					t.Fatalf("abort: %v", err)
				}
			}
			if got.ID != sub.ID || got.Status != tc.want {
				t.Fatalf("abort returned %+v, want %s", got, tc.want)
			}
			if s := r.sub(t, sub.ID); s.Status != tc.want {
				t.Fatalf("stored %+v", s)
			}
			settledOnce(t, settlements(t, r.db, key), sub.ID, record.Outcome(tc.want), "")
		})
	}
	t.Run("unknown", func(t *testing.T) {
		r := newRig(t, agents{"a": {}})
		if _, err := r.core.Abort(ctx, "sub_nosuch"); !errors.Is(err, log.ErrSubmissionNotFound) {
			t.Fatalf("abort of an unknown submission: %v", err)
		}
	})
}

func TestAbortSession(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, agents{"a": {Busy: worker.BusyQueue}})
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	other := record.Key{Agent: "a", Instance: "i", Session: "other"}
	running := startTurn(t, r.db, r.admit(t, key, "one"))
	queued := []record.Submission{r.admit(t, key, "two"), r.admit(t, key, "three")}
	done := r.admit(t, key, "four")
	if _, err := r.core.Abort(ctx, done.ID); err != nil {
		t.Fatal(err)
	}
	untouched := r.admit(t, other, "elsewhere")
	if err := r.core.AbortSession(ctx, key); err != nil {
		t.Fatal(err)
	}
	if ids := r.pendingIDs(t, key); len(ids) != 0 {
		t.Fatalf("pending after AbortSession: %v", ids)
	}
	sts := settlements(t, r.db, key)
	for _, s := range append([]record.Submission{running, done}, queued...) {
		settledOnce(t, sts, s.ID, record.OutcomeAborted, "")
	}
	if s := r.sub(t, untouched.ID); s.Status != record.StatusAdmitted {
		t.Fatalf("another session's submission: %+v", s)
	}
	// Nothing to abort is no error.
	if err := r.core.AbortSession(ctx, record.Key{Agent: "a", Instance: "i", Session: "empty"}); err != nil {
		t.Fatal(err)
	}
}
