package remote_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/remote"
)

// A session whose backlog is larger than one NATS message can carry still
// drains: a turn asks the owner for the first submissions it may take, not
// for the whole backlog, whose answer the broker would drop (the worker
// then retried it forever and the session never ran again: found by the
// cluster torture, 9,459 submissions of one session left admitted).
func TestBacklogLargerThanMaxPayloadDrains(t *testing.T) {
	o := startOwner(t)
	key := record.Key{Agent: "echo", Instance: "i", Session: "backlog"}
	// A submission's answer is ~150 bytes: 9,000 of them are over the
	// broker's 1 MB max_payload.
	const n = 9000
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make(chan error, 1)
	for w := range 32 {
		wg.Go(func() {
			for i := w; i < n; i += 32 {
				sub, _, err := o.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord("queued")}})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				ids[i] = sub.ID
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	all, err := o.db.Pending(context.Background(), key)
	if err != nil || len(all) != n {
		t.Fatalf("pending: %d, %v", len(all), err)
	}
	o.relay.Kick()
	startWorker(t, o)
	waitFor(t, "the backlog to drain", func() bool {
		p, err := o.db.PendingFirst(context.Background(), key, 1)
		return err == nil && len(p) == 0
	})
	for _, id := range []string{ids[0], ids[n/2], ids[n-1]} {
		if got := o.settled(t, id); got.Status != record.StatusCompleted {
			t.Fatalf("submission %s: %+v", id, got)
		}
	}
}

// A read whose answer is over the broker's max_payload fails at once with
// ErrTooLarge, not after the retries of a reply that never comes.
func TestAnswerOverMaxPayloadIsAnError(t *testing.T) {
	o := startOwner(t)
	key := record.Key{Agent: "nobody", Instance: "i", Session: "big"}
	// Two 700 KB messages in one batch: over 1 MB together.
	big := strings.Repeat("x", 700<<10)
	if _, err := o.db.Append(context.Background(), key, userRecord(big), userRecord(big)); err != nil {
		t.Fatal(err)
	}
	c := o.client(t)
	holdLease(t, o, c.InstanceID(), key)
	_, err := c.Read(context.Background(), key, record.Start, 1)
	if !errors.Is(err, remote.ErrTooLarge) {
		t.Fatalf("read of a batch over max_payload: %v, want ErrTooLarge", err)
	}
	if !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("error does not say what to raise: %v", err)
	}
	// A request over the limit is refused the same way, before it is sent.
	w := clog.Write{Key: key, Records: []record.Record{userRecord(big), userRecord(big)}}
	if _, err := c.Write(context.Background(), w); !errors.Is(err, remote.ErrTooLarge) {
		t.Fatalf("write over max_payload: %v, want ErrTooLarge", err)
	}
}
