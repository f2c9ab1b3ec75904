package pool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/pool"
)

// parrot replies with its prompt; its first turn waits for a release, so
// that messages queue behind it.
type parrot struct {
	once    sync.Once
	started chan struct{}
	release chan struct{}
}

func (a *parrot) Invoke(ctx context.Context, _ worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
	return func(yield func(worker.Event) bool) {
		first := false
		a.once.Do(func() { first = true })
		if first {
			close(a.started)
			select {
			case <-a.release:
			case <-ctx.Done():
				return
			}
		}
		if yield(worker.Text(p.Text)) {
			yield(worker.Completed(nil))
		}
	}
}

// replies gathers the text of the assistant messages of each turn.
func replies(t *testing.T, r *rig, key record.Key) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, rec := range r.records(t, key) {
		if rec.Entry == nil || rec.Entry.Type != record.EntryAssistantMessage {
			continue
		}
		var m record.MessagePayload
		if err := json.Unmarshal(rec.Entry.Payload, &m); err != nil {
			t.Fatal(err)
		}
		for _, p := range m.Parts {
			out[rec.Entry.TurnID] += p.Text
		}
	}
	return out
}

// Issue 8 item 1: five 4 MiB messages queued behind a running turn made a
// next turn whose reply the log could not store; none got a reply and all
// were settled "interrupted". Each must get its reply.
func TestLargeQueuedMessagesAllAnswered(t *testing.T) {
	a := &parrot{started: make(chan struct{}), release: make(chan struct{})}
	r := startRig(t, func(reg *pool.Registry) { reg.Register("parrot", a, "") })
	key := record.Key{Agent: "parrot", Instance: "i", Session: "big"}
	first := r.admit(t, key, "hold")
	<-a.started
	var subs []record.Submission
	texts := map[string]string{}
	for i := range 5 {
		text := fmt.Sprint(i) + strings.Repeat("x", 4<<20)
		s := r.admit(t, key, text)
		subs = append(subs, s)
		texts[s.ID] = text
	}
	close(a.release)
	if s := r.settled(t, first.ID); s.Status != record.StatusCompleted {
		t.Fatalf("first %+v", s)
	}
	for _, s := range subs {
		got := r.settled(t, s.ID)
		if got.Status != record.StatusCompleted {
			t.Fatalf("submission %s: %+v %+v", s.ID, got, got.Error)
		}
	}
	byTurn := replies(t, r, key)
	for _, s := range subs {
		got, _ := r.db.Submission(context.Background(), s.ID)
		if !strings.Contains(byTurn[got.TurnID], texts[s.ID]) {
			t.Fatalf("submission %s: its turn's reply (%d bytes) does not hold its message", s.ID, len(byTurn[got.TurnID]))
		}
	}
}

// A reply larger than one log batch is stored in pieces, in order.
func TestHugeReplyStoredInPieces(t *testing.T) {
	huge := strings.Repeat("é", 10<<20) // 20 MiB of two-byte runes, in one delta
	agent := worker.AgentFunc(func(ctx context.Context, _ worker.Scope, _ worker.Prompt) iter.Seq[worker.Event] {
		return func(yield func(worker.Event) bool) {
			if yield(worker.Text(huge)) {
				yield(worker.Completed(nil))
			}
		}
	})
	r := startRig(t, func(reg *pool.Registry) { reg.Register("loud", agent, "") })
	key := record.Key{Agent: "loud", Instance: "i", Session: "s"}
	sub := r.admit(t, key, "say a lot")
	if got := r.settled(t, sub.ID); got.Status != record.StatusCompleted {
		t.Fatalf("%+v %+v", got, got.Error)
	}
	got, _ := r.db.Submission(context.Background(), sub.ID)
	if reply := replies(t, r, key)[got.TurnID]; reply != huge {
		t.Fatalf("reply of %d bytes, want %d", len(reply), len(huge))
	}
}

// A reply the log refuses whatever is done (a result datum over the batch
// limit) settles failed with a code that says so, not "interrupted", and
// the session goes on.
func TestUnstorableReplySettlesTruly(t *testing.T) {
	data, _ := json.Marshal(strings.Repeat("d", record.MaxBatchBytes))
	agent := worker.AgentFunc(func(ctx context.Context, _ worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
		return func(yield func(worker.Event) bool) {
			if p.Text == "small" {
				yield(worker.Completed(nil))
				return
			}
			if yield(worker.Text("partial answer")) {
				yield(worker.Completed(data))
			}
		}
	})
	r := startRig(t, func(reg *pool.Registry) { reg.Register("data", agent, "") })
	key := record.Key{Agent: "data", Instance: "i", Session: "s"}
	sub := r.admit(t, key, "too much")
	got := r.settled(t, sub.ID)
	if got.Status != record.StatusFailed || got.Error == nil || got.Error.Code != "reply_too_large" || got.Error.Retryable {
		t.Fatalf("%+v %+v", got, got.Error)
	}
	next := r.admit(t, key, "small")
	if got := r.settled(t, next.ID); got.Status != record.StatusCompleted {
		t.Fatalf("next %+v", got)
	}
}

// A turn whose final write the log refuses for another reason (here a
// full disk, once) settles failed "storage", saying why, instead of staying
// running until a sweep calls it "interrupted".
func TestRefusedSettlementSettlesStorage(t *testing.T) {
	var h *hookedLog
	r := startRigWith(t, t.TempDir(), nil, rigOptions{wrap: func(l pool.Log) pool.Log { h = &hookedLog{Log: l}; return h }})
	var once sync.Once
	h.mu.Lock()
	h.refuse = func(w clog.Write) (err error) {
		if len(w.Settle) > 0 && len(w.Records) > 0 {
			once.Do(func() { err = errors.New("no space left on device") })
		}
		return err
	}
	h.mu.Unlock()
	key := record.Key{Agent: "echo", Instance: "i", Session: "full"}
	sub := r.admit(t, key, "a reply that cannot be stored")
	got := r.settled(t, sub.ID)
	if got.Status != record.StatusFailed || got.Error == nil || got.Error.Code != "storage" || !strings.Contains(got.Error.Message, "no space left") {
		t.Fatalf("%+v %+v", got, got.Error)
	}
}
