package log_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A Watch follows one stream across many commits: each commit closes the
// channel taken before it, and the channel taken after it is open until
// the next; a read through the Watch sees what the commit appended.
func TestWatchFollowsCommits(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	w := db.Watch(testKey)
	defer w.Close()
	defer w.Close() // safe twice
	if w.Waiters() != 1 {
		t.Fatalf("waiters = %d, want 1", w.Waiters())
	}
	off := record.Start
	for i := range 3 {
		ch := w.Changed()
		if closed(ch) {
			t.Fatalf("commit %d: changed before the commit", i)
		}
		a, err := db.Append(ctx, testKey, userEntry("m"))
		if err != nil {
			t.Fatal(err)
		}
		// Without a WakeDelay the wake-up comes before Append returns.
		if !closed(ch) {
			t.Fatalf("commit %d: not woken", i)
		}
		res, err := w.Read(ctx, off, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Batches) != 1 || res.Batches[0].Offset != a.Offset || !res.UpToDate {
			t.Fatalf("commit %d: read %+v, want the batch at %s", i, res, a.Offset)
		}
		off = res.NextOffset
	}
	other := db.Watch(testKey)
	if w.Waiters() != 2 {
		t.Fatalf("waiters = %d with two watches", w.Waiters())
	}
	other.Close()
	if w.Waiters() != 1 {
		t.Fatalf("waiters = %d after one closed", w.Waiters())
	}
}

// An invalid key is reported by Read, as by DB.Read.
func TestWatchInvalidKey(t *testing.T) {
	db := openTestDB(t, nil)
	w := db.Watch(record.Key{Agent: "a/b", Instance: "i", Session: "s"})
	defer w.Close()
	if _, err := w.Read(context.Background(), record.Start, 0, 0); !errors.Is(err, clog.ErrInvalidName) {
		t.Fatalf("read of an invalid key: %v", err)
	}
}

// With a WakeDelay, the commits of a window wake the stream's waiters once,
// at its end, and the woken reader finds them all; a commit after the
// wake-up schedules its own. A stream with fewer waiters than the delay
// asks for wakes at once.
func TestWakeDelayGathersCommits(t *testing.T) {
	ctx := context.Background()
	const window = 300 * time.Millisecond
	db := openTestDB(t, &clog.Options{WakeDelay: func(waiters int) time.Duration {
		if waiters < 2 {
			return 0
		}
		return window
	}})

	// One waiter: no delay.
	w := db.Watch(testKey)
	defer w.Close()
	ch := w.Changed()
	a0, err := db.Append(ctx, testKey, userEntry("alone"))
	if err != nil {
		t.Fatal(err)
	}
	if !closed(ch) {
		t.Fatal("a single waiter was not woken at once")
	}

	// Two waiters: the window.
	w2 := db.Watch(testKey)
	defer w2.Close()
	for round := range 2 {
		ch, ch2 := w.Changed(), w2.Changed()
		began := time.Now()
		var last clog.Appended
		for range 3 {
			if last, err = db.Append(ctx, testKey, userEntry("gathered")); err != nil {
				t.Fatal(err)
			}
		}
		if time.Since(began) < window && (closed(ch) || closed(ch2)) {
			t.Fatalf("round %d: woken within the window, %s after its first commit", round, time.Since(began))
		}
		for _, c := range []<-chan struct{}{ch, ch2} {
			select {
			case <-c:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: no wake-up 10 s after the window", round)
			}
		}
		res, err := w.Read(ctx, a0.NextOffset, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.NextOffset != last.NextOffset || !res.UpToDate {
			t.Fatalf("round %d: the woken reader read up to %s, want %s", round, res.NextOffset, last.NextOffset)
		}
		a0.NextOffset = last.NextOffset
	}
}

// Under a WakeDelay no wake-up is lost: readers that take the channel, read
// and wait only for it, over and over while a writer appends, all reach
// the last record.
func TestWakeDelayLosesNoWakeup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := openTestDB(t, &clog.Options{WakeDelay: func(int) time.Duration { return time.Millisecond }})
	const writes, readers = 200, 8
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for range readers {
		w := db.Watch(testKey)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Close()
			off, seen := record.Start, 0
			for {
				ch := w.Changed()
				res, err := w.Read(ctx, off, 0, 0)
				if err != nil {
					errs <- err
					return
				}
				for _, b := range res.Batches {
					seen += b.Count
				}
				off = res.NextOffset
				if seen == writes {
					return
				}
				select {
				case <-ch:
				case <-ctx.Done():
					errs <- fmt.Errorf("a reader saw %d of %d records and waited a minute: a wake-up was lost", seen, writes)
					return
				}
			}
		}()
	}
	for range writes {
		if _, err := db.Append(ctx, testKey, userEntry("w")); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
