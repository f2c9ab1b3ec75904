package pool_test

import (
	"context"
	"iter"
	"sync"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/pool"
)

// hookedLog runs onRead before the pool's next read of a stream (the read
// of a turn's prompt), once, and tells watchers what the pool's submission
// lookups return.
type hookedLog struct {
	pool.Log
	mu        sync.Mutex
	onRead    func(ctx context.Context)
	onPending func(key record.Key)
	// refuse, when set, may refuse a write before the log sees it.
	refuse   func(w clog.Write) error
	watchID  string
	watchers chan record.Status
}

func (h *hookedLog) Read(ctx context.Context, key record.Key, off record.Offset, limit int) (record.ReadResult, error) {
	h.mu.Lock()
	f := h.onRead
	h.onRead = nil
	h.mu.Unlock()
	if f != nil {
		f(ctx)
	}
	return h.Log.Read(ctx, key, off, limit)
}

func (h *hookedLog) PendingFirst(ctx context.Context, key record.Key, limit int) ([]record.Submission, error) {
	h.mu.Lock()
	f := h.onPending
	h.mu.Unlock()
	if f != nil {
		f(key)
	}
	return h.Log.PendingFirst(ctx, key, limit)
}

func (h *hookedLog) Write(ctx context.Context, w clog.Write) (clog.Appended, error) {
	h.mu.Lock()
	f := h.refuse
	h.mu.Unlock()
	if f != nil {
		if err := f(w); err != nil {
			return clog.Appended{}, err
		}
	}
	return h.Log.Write(ctx, w)
}

func (h *hookedLog) Submission(ctx context.Context, id string) (record.Submission, error) {
	s, err := h.Log.Submission(ctx, id)
	h.mu.Lock()
	w := h.watchers
	watched := id == h.watchID
	h.mu.Unlock()
	if watched && err == nil && w != nil {
		select {
		case w <- s.Status:
		default:
		}
	}
	return s, err
}

// Issue 8 item 2: 255 queued messages, the last aborted as their turn
// starts. The abort cancelled the context the turn's prompt was being read
// with, so the whole turn failed "prompt_unreadable" (retryable) and the
// abort answered "failed". The turn's submissions must end aborted, as
// docs/protocol.md says, and the session must go on.
func TestAbortAsTurnStartsSettlesAborted(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	agent := worker.AgentFunc(func(ctx context.Context, _ worker.Scope, p worker.Prompt) iter.Seq[worker.Event] {
		return func(yield func(worker.Event) bool) {
			select {
			case started <- struct{}{}:
			default:
			}
			if p.Text == "hold" {
				<-release
			} else if p.Text != "after" {
				<-ctx.Done() // until aborted
				return
			}
			if yield(worker.Text("re: " + p.Text)) {
				yield(worker.Completed(nil))
			}
		}
	})
	var h *hookedLog
	r := startRigWith(t, t.TempDir(), func(reg *pool.Registry) { reg.Register("a", agent, "") },
		rigOptions{wrap: func(l pool.Log) pool.Log { h = &hookedLog{Log: l}; return h }})
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	first := r.admit(t, key, "hold")
	<-started
	var queued []record.Submission
	for i := range 255 {
		queued = append(queued, r.admit(t, key, "q"+string(rune('a'+i%26))))
	}
	last := queued[len(queued)-1]

	type result struct {
		sub record.Submission
		err error
	}
	aborted := make(chan result, 1)
	seen := make(chan record.Status, 1)
	h.mu.Lock()
	h.watchID, h.watchers = last.ID, seen
	h.onRead = func(ctx context.Context) {
		// The next turn reads its prompt: abort its last submission now.
		go func() {
			s, err := r.pool.Abort(context.Background(), last.ID)
			aborted <- result{s, err}
		}()
		if st := <-seen; st == record.StatusRunning {
			// The turn is registered: the abort cancels it. Let that land
			// before the read goes on, as it may in production.
			<-ctx.Done()
		}
	}
	h.mu.Unlock()
	close(release)
	if s := r.settled(t, first.ID); s.Status != record.StatusCompleted {
		t.Fatalf("first %+v", s)
	}
	res := <-aborted
	if res.err != nil || res.sub.Status != record.StatusAborted || res.sub.Error == nil || res.sub.Error.Code != "aborted" {
		t.Fatalf("abort answered %+v %+v %v", res.sub, res.sub.Error, res.err)
	}
	turn := res.sub.TurnID
	for _, q := range queued {
		s := r.settled(t, q.ID)
		if s.TurnID != turn {
			continue // in a later turn: not affected by the abort
		}
		if s.Status != record.StatusAborted || s.Error == nil || s.Error.Code != "aborted" {
			t.Fatalf("submission %s of the aborted turn: %+v %+v", q.ID, s, s.Error)
		}
	}
	after := r.admit(t, key, "after")
	if s := r.settled(t, after.ID); s.Status != record.StatusCompleted {
		t.Fatalf("after %+v", s)
	}
}
