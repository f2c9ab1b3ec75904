package pool_test

import (
	"context"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/pool"
)

// TestQuiesce: with abortFirst, the change runs after the running turn
// was cancelled and settled (aborted, in its stream), and no turn starts
// while it runs; without, the change runs first and the turn is cancelled
// after it.
func TestQuiesce(t *testing.T) {
	b := &blocker{started: make(chan string, 10), release: make(chan struct{})}
	r := startRig(t, func(reg *pool.Registry) { reg.Register("slow", b, "") })
	key := record.Key{Agent: "slow", Instance: "i", Session: "s"}
	running := r.admit(t, key, "one")
	<-b.started
	queued := r.admit(t, key, "two")
	ctx := context.Background()
	err := r.pool.Quiesce(ctx, []record.Key{key}, true, func(ctx context.Context) error {
		s, err := r.db.Submission(ctx, running.ID)
		if err != nil || s.Status != record.StatusAborted {
			t.Errorf("inside: the running submission is %+v %v", s, err)
		}
		// Still admitted: no turn started it while the change ran.
		if s, _ := r.db.Submission(ctx, queued.ID); s.Status != record.StatusAdmitted {
			t.Errorf("inside: the queued submission is %+v", s)
		}
		_, _, err = r.db.Change(ctx, clog.Change{Kind: clog.ChangeRewind, Key: key, EntryID: running.EntryID})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := r.settled(t, queued.ID); s.Status != record.StatusAborted || s.Error.Code != "rewound" {
		t.Fatalf("queued after the rewind: %+v", s)
	}

	// Without abortFirst: the change sees the turn running, then the turn
	// is cancelled.
	next := r.admit(t, key, "three")
	<-b.started
	err = r.pool.Quiesce(ctx, []record.Key{key}, false, func(ctx context.Context) error {
		if s, _ := r.db.Submission(ctx, next.ID); s.Status != record.StatusRunning {
			t.Errorf("inside: %+v", s)
		}
		_, err := r.db.Reset(ctx, key)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := r.settled(t, next.ID); s.Status != record.StatusAborted || s.Error.Code != "stream_reset" {
		t.Fatalf("after the reset: %+v", s)
	}
}
