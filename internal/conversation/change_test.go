package conversation_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/worker"

	"fmt"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log/record"
)

// within runs fn and fails the test if it does not return within a
// generous bound: a call that must not wait for another change.
func within(t *testing.T, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: still waiting after 30s", what)
		return nil
	}
}

// holdChange starts ch in the background and returns once it is inside
// the runner's Quiesce, where it stays until release is closed; wait
// returns its error.
func holdChange(t *testing.T, r *rig, ch log.Change) (release func(), wait func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, _, err := r.core.Change(context.Background(), ch)
		done <- err
	}()
	select {
	case <-r.runner.entered:
	case err := <-done:
		t.Fatalf("%s ended without quiescing: %v", ch.Kind, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not reach Quiesce", ch.Kind)
	}
	var closed bool
	release = func() {
		if !closed {
			closed = true
			close(r.runner.release)
		}
	}
	t.Cleanup(release)
	return release, func() error {
		release()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatalf("%s still running after its release", ch.Kind)
			return nil
		}
	}
}

func blockingRig(t *testing.T, keys ...record.Key) *rig {
	t.Helper()
	r := newRig(t, agents{"a": {Busy: worker.BusyQueue}})
	r.runner.block = map[record.Key]bool{}
	for _, k := range keys {
		r.runner.block[k] = true
	}
	r.runner.entered = make(chan []record.Key, 1)
	r.runner.release = make(chan struct{})
	return r
}

// completed admits a message and settles it completed: a conversation
// with a user message to change.
func (r *rig) completed(t *testing.T, key record.Key, text string) record.Submission {
	t.Helper()
	sub := r.admit(t, key, text)
	if err := settle(context.Background(), r.db, sub, record.OutcomeCompleted); err != nil {
		t.Fatal(err)
	}
	return sub
}

// A second change of a session held by a change is refused, not queued,
// whatever its kind; changes of other sessions and deliveries go on.
func TestChangeSerialisedPerSession(t *testing.T) {
	ctx := context.Background()
	held := record.Key{Agent: "a", Instance: "i", Session: "s"}
	r := blockingRig(t, held)
	sibling := record.Key{Agent: "a", Instance: "i", Session: "t"}
	elsewhere := record.Key{Agent: "a", Instance: "j", Session: "s"}
	heldSub := r.completed(t, held, "held")
	siblingSub := r.completed(t, sibling, "sibling")
	r.completed(t, elsewhere, "elsewhere")

	_, wait := holdChange(t, r, log.Change{Kind: log.ChangeRewind, Key: held, EntryID: heldSub.EntryID})
	quiesced := len(r.runner.quiesceCalls())
	for _, tc := range []struct {
		name    string
		ch      log.Change
		refused bool
	}{
		{"rewind of the held session", log.Change{Kind: log.ChangeRewind, Key: held, EntryID: heldSub.EntryID}, true},
		{"regenerate of the held session", log.Change{Kind: log.ChangeRegenerate, Key: held}, true},
		{"reset of the held session", log.Change{Kind: log.ChangeReset, Key: held}, true},
		{"fork from the held session", log.Change{Kind: log.ChangeFork, Key: held, EntryID: heldSub.EntryID,
			Target: record.Key{Agent: "a", Instance: "i", Session: "copy1"}}, true},
		{"fork into the held session", log.Change{Kind: log.ChangeFork, Key: sibling, EntryID: siblingSub.EntryID, Target: held}, true},
		{"delete of the held session's instance", log.Change{Kind: log.ChangeDelete, Key: record.Key{Agent: "a", Instance: "i", Session: "t"}}, true},
		{"fork of a sibling session", log.Change{Kind: log.ChangeFork, Key: sibling, EntryID: siblingSub.EntryID,
			Target: record.Key{Agent: "a", Instance: "i", Session: "copy2"}}, false},
		{"rewind of a sibling session", log.Change{Kind: log.ChangeRewind, Key: sibling, EntryID: siblingSub.EntryID}, false},
		{"reset of a sibling session", log.Change{Kind: log.ChangeReset, Key: sibling}, false},
		{"delete of another instance", log.Change{Kind: log.ChangeDelete, Key: elsewhere}, false},
	} {
		err := within(t, tc.name, func() error {
			_, _, err := r.core.Change(ctx, tc.ch)
			return err
		})
		switch {
		case tc.refused && !errors.Is(err, conversation.ErrChangeInProgress):
			t.Errorf("%s: %v, want ErrChangeInProgress", tc.name, err)
		case !tc.refused && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		}
		if n := len(r.runner.quiesceCalls()); tc.refused && n != quiesced {
			t.Errorf("%s: refused, yet it quiesced the runner", tc.name)
		} else {
			quiesced = n
		}
	}
	// A delivery is not a change.
	var delivered record.Submission
	if err := within(t, "a delivery to the held session", func() (err error) {
		delivered, _, err = r.core.Admit(ctx, admission(held, "meanwhile"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatalf("the held change: %v", err)
	}
	// The change that commits after the delivery accounts for it.
	settledOnce(t, settlements(t, r.db, held), delivered.ID, record.OutcomeAborted, "rewound")

	// Released: the session takes changes again, and a change that fails
	// releases it too.
	r.runner.block = nil
	if _, _, err := r.core.Change(ctx, log.Change{Kind: log.ChangeRewind, Key: held, EntryID: "nosuch"}); err == nil || errors.Is(err, conversation.ErrChangeInProgress) {
		t.Fatalf("rewind to an unknown entry: %v", err)
	}
	if _, _, err := r.core.Change(ctx, log.Change{Kind: log.ChangeReset, Key: held}); err != nil {
		t.Fatalf("after the held change: %v", err)
	}
}

// A delete holds its whole instance: no session of it changes meanwhile.
func TestChangeDeleteHoldsInstance(t *testing.T) {
	ctx := context.Background()
	s := record.Key{Agent: "a", Instance: "i", Session: "s"}
	r := blockingRig(t, s)
	sibling := record.Key{Agent: "a", Instance: "i", Session: "t"}
	other := record.Key{Agent: "a", Instance: "j", Session: "t"}
	r.completed(t, s, "one")
	sib := r.completed(t, sibling, "two")
	oth := r.completed(t, other, "three")
	_, wait := holdChange(t, r, log.Change{Kind: log.ChangeDelete, Key: s})
	for _, tc := range []struct {
		name    string
		ch      log.Change
		refused bool
	}{
		{"rewind of a session of the instance", log.Change{Kind: log.ChangeRewind, Key: sibling, EntryID: sib.EntryID}, true},
		{"reset of a session of the instance", log.Change{Kind: log.ChangeReset, Key: record.Key{Agent: "a", Instance: "i", Session: "new"}}, true},
		{"fork into the instance", log.Change{Kind: log.ChangeFork, Key: other, EntryID: oth.EntryID, Target: record.Key{Agent: "a", Instance: "i", Session: "copy"}}, true},
		{"a second delete", log.Change{Kind: log.ChangeDelete, Key: sibling}, true},
		{"rewind in another instance", log.Change{Kind: log.ChangeRewind, Key: other, EntryID: oth.EntryID}, false},
	} {
		err := within(t, tc.name, func() error {
			_, _, err := r.core.Change(ctx, tc.ch)
			return err
		})
		switch {
		case tc.refused && !errors.Is(err, conversation.ErrChangeInProgress):
			t.Errorf("%s: %v, want ErrChangeInProgress", tc.name, err)
		case !tc.refused && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

// What each change asks of the runner, and what becomes of a running and
// a queued submission of the changed session.
func TestChangeQuiescesTheRunner(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		kind log.ChangeKind
		// quiesce is the runner call wanted: nil for none.
		quiesce *bool
		// runningCode and queuedCode are the codes the running and the
		// queued submission settle aborted with; "" for not settled.
		runningCode, queuedCode string
		newSubmission           bool
	}{
		{kind: log.ChangeRewind, quiesce: ptr(true), runningCode: "aborted", queuedCode: "rewound"},
		{kind: log.ChangeRegenerate, quiesce: ptr(true), runningCode: "aborted", queuedCode: "regenerated", newSubmission: true},
		// A reset does not abort the running turn first: the reset
		// settles it in the new incarnation, and the runner stops it
		// after.
		{kind: log.ChangeReset, quiesce: ptr(false), runningCode: "stream_reset", queuedCode: "stream_reset"},
		// A fork only copies.
		{kind: log.ChangeFork},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			r := newRig(t, agents{"a": {Busy: worker.BusyQueue}})
			key := record.Key{Agent: "a", Instance: "i", Session: "s"}
			one := r.completed(t, key, "one")
			running := startTurn(t, r.db, r.admit(t, key, "two"))
			queued := r.admit(t, key, "three")
			kicked := r.kicks.n.Load()
			ch := log.Change{Kind: tc.kind, Key: key, EntryID: running.EntryID}
			if tc.kind == log.ChangeRegenerate {
				ch.EntryID = ""
			}
			if tc.kind == log.ChangeFork {
				ch.EntryID, ch.Target = one.EntryID, record.Key{Agent: "a", Instance: "i", Session: "copy"}
			}
			res, replayed, err := r.core.Change(ctx, ch)
			if err != nil || replayed {
				t.Fatalf("%s: %v (replayed %v)", tc.kind, err, replayed)
			}
			calls := r.runner.quiesceCalls()
			if tc.quiesce == nil {
				if len(calls) != 0 {
					t.Fatalf("quiesced %+v", calls)
				}
			} else if len(calls) != 1 || !slices.Equal(calls[0].keys, []record.Key{key}) || calls[0].abortFirst != *tc.quiesce {
				t.Fatalf("quiesce calls %+v, want one of [%s] with abortFirst %v", calls, key, *tc.quiesce)
			}
			// The core aborts nothing itself: the runner's Quiesce and
			// the change's transaction do.
			if a := r.runner.abortCalls(); len(a) != 0 {
				t.Fatalf("the core aborted %v", a)
			}
			sts := settlements(t, r.db, key)
			for _, c := range []struct {
				sub  record.Submission
				code string
			}{{running, tc.runningCode}, {queued, tc.queuedCode}} {
				if c.code == "" {
					if len(sts[c.sub.ID]) != 0 || r.sub(t, c.sub.ID).Status.Terminal() {
						t.Fatalf("%s settled by a %s: %+v", c.sub.ID, tc.kind, sts[c.sub.ID])
					}
					continue
				}
				settledOnce(t, sts, c.sub.ID, record.OutcomeAborted, c.code)
				if s := r.sub(t, c.sub.ID); s.Status != record.StatusAborted {
					t.Fatalf("%+v", s)
				}
			}
			// The change's own answer lists the queued submissions it
			// settled (not the running one the runner aborted first).
			wantAborted := []string{}
			switch tc.kind {
			case log.ChangeRewind, log.ChangeRegenerate:
				wantAborted = []string{queued.ID}
			case log.ChangeReset:
				wantAborted = []string{running.ID, queued.ID}
			}
			if !slices.Equal(res.Aborted, wantAborted) {
				t.Fatalf("res.Aborted %v, want %v", res.Aborted, wantAborted)
			}
			wantKicks := kicked
			if tc.newSubmission {
				wantKicks++
				if res.Submission == nil || res.Submission.Status != record.StatusAdmitted {
					t.Fatalf("regenerate: %+v", res.Submission)
				}
			}
			if n := r.kicks.n.Load(); n != wantKicks {
				t.Fatalf("%d kicks, want %d", n, wantKicks)
			}
			if tc.kind == log.ChangeFork {
				if ids := r.pendingIDs(t, key); !slices.Equal(ids, []string{running.ID, queued.ID}) {
					t.Fatalf("the source's pending %v", ids)
				}
				if res.TargetSession != "copy" {
					t.Fatalf("%+v", res)
				}
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A delete quiesces every session of the instance, aborting their running
// turns first, and settles the queued submissions in their streams in a
// commit of their own before the delete's: every submission ends with
// exactly one settlement that a live reader can see.
func TestChangeDeleteSettlesQueued(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, agents{"a": {Busy: worker.BusyQueue}})
	s1 := record.Key{Agent: "a", Instance: "i", Session: "s1"}
	s2 := record.Key{Agent: "a", Instance: "i", Session: "s2"}
	other := record.Key{Agent: "a", Instance: "j", Session: "s1"}
	done := r.completed(t, s1, "done")
	running := startTurn(t, r.db, r.admit(t, s1, "running"))
	queued := []record.Submission{r.admit(t, s1, "q1"), r.admit(t, s1, "q2"), r.admit(t, s2, "q3")}
	untouched := r.admit(t, other, "elsewhere")

	var before map[record.Key]map[string][]record.Settlement
	r.log.onChange = func(ch log.Change) {
		if ch.Kind != log.ChangeDelete {
			t.Errorf("change %s", ch.Kind)
		}
		before = map[record.Key]map[string][]record.Settlement{s1: settlements(t, r.db, s1), s2: settlements(t, r.db, s2)}
	}
	res, _, err := r.core.Change(ctx, log.Change{Kind: log.ChangeDelete, Key: record.Key{Agent: "a", Instance: "i", Session: "whatever"}})
	if err != nil {
		t.Fatal(err)
	}
	calls := r.runner.quiesceCalls()
	if len(calls) != 1 || !calls[0].abortFirst {
		t.Fatalf("quiesce calls %+v", calls)
	}
	keys := slices.Clone(calls[0].keys)
	slices.SortFunc(keys, func(a, b record.Key) int { return strings.Compare(a.Session, b.Session) })
	if !slices.Equal(keys, []record.Key{s1, s2}) {
		t.Fatalf("quiesced %v, want every session of the instance", calls[0].keys)
	}
	if before == nil {
		t.Fatal("the delete did not reach the log")
	}
	settledOnce(t, before[s1], done.ID, record.OutcomeCompleted, "")
	settledOnce(t, before[s1], running.ID, record.OutcomeAborted, "aborted")
	for _, q := range queued {
		settledOnce(t, before[q.Key], q.ID, record.OutcomeAborted, "deleted")
	}
	// Nothing was left for the delete's own transaction.
	if len(res.Aborted) != 0 {
		t.Fatalf("res.Aborted %v", res.Aborted)
	}
	slices.Sort(res.Sessions)
	if !slices.Equal(res.Sessions, []string{"s1", "s2"}) {
		t.Fatalf("res.Sessions %v", res.Sessions)
	}
	for _, s := range append([]record.Submission{running}, queued...) {
		if got := r.sub(t, s.ID); got.Status != record.StatusAborted {
			t.Fatalf("%+v", got)
		}
	}
	if a := r.runner.abortCalls(); len(a) != 0 {
		t.Fatalf("the core aborted %v", a)
	}
	if got := r.sub(t, untouched.ID); got.Status != record.StatusAdmitted {
		t.Fatalf("another instance's submission: %+v", got)
	}
	// A delete of no instance is ErrInstanceNotFound.
	if _, _, err := r.core.Change(ctx, log.Change{Kind: log.ChangeDelete, Key: record.Key{Agent: "a", Instance: "nosuch", Session: "s"}}); !errors.Is(err, log.ErrInstanceNotFound) {
		t.Fatalf("delete of no instance: %v", err)
	}
}

// A retry of the change in progress (same idempotency key: a client whose
// first try timed out while the change waited for a running turn) waits
// for the first try and gets its answer, where a different change is
// still refused. The torture's cluster run found the retry refused with
// mutation_in_progress.
func TestChangeRetryWaitsForItsFirstTry(t *testing.T) {
	ctx := context.Background()
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	r := blockingRig(t, key)
	sub := r.completed(t, key, "hello")
	rewind := log.Change{Kind: log.ChangeRewind, Key: key, EntryID: sub.EntryID, IdempotencyKey: "rewind-1", RequestHash: "h1"}
	_, wait := holdChange(t, r, rewind)

	type answer struct {
		res      log.ChangeResult
		replayed bool
		err      error
	}
	retried := make(chan answer, 1)
	go func() {
		res, replayed, err := r.core.Change(ctx, rewind)
		retried <- answer{res, replayed, err}
	}()
	check.For(t, 30*time.Second, time.Millisecond, func() error {
		if n := r.core.Waiting(); n != 1 {
			return fmt.Errorf("%d retries waiting, want 1", n)
		}
		return nil
	})

	// Another change, or the same with another key, is refused as before.
	other := rewind
	other.IdempotencyKey = "rewind-2"
	for _, ch := range []log.Change{other, {Kind: log.ChangeReset, Key: key}} {
		if _, _, err := r.core.Change(ctx, ch); !errors.Is(err, conversation.ErrChangeInProgress) {
			t.Errorf("%s (key %q) during the first try: %v, want ErrChangeInProgress", ch.Kind, ch.IdempotencyKey, err)
		}
	}

	// A retry that gives up while it waits leaves with its context's error.
	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, _, err := r.core.Change(cctx, rewind)
		gaveUp <- err
	}()
	check.For(t, 30*time.Second, time.Millisecond, func() error {
		if n := r.core.Waiting(); n != 2 {
			return fmt.Errorf("%d retries waiting, want 2", n)
		}
		return nil
	})
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Errorf("a retry whose context ended: %v, want context.Canceled", err)
	}

	if err := wait(); err != nil {
		t.Fatalf("the first try: %v", err)
	}
	a := <-retried
	if a.err != nil {
		t.Fatalf("the retry: %v", a.err)
	}
	if !a.replayed {
		t.Errorf("the retry was not answered with the first try's result")
	}
	if r.core.Waiting() != 0 {
		t.Errorf("%d retries still counted as waiting", r.core.Waiting())
	}
}
