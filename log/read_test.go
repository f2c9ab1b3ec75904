package log_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

func TestReadPaging(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	var offsets []record.Offset
	for i := range 10 {
		recs := make([]record.Record, i%3+1)
		for j := range recs {
			recs[j] = userEntry("r")
		}
		a, err := db.Append(ctx, testKey, recs...)
		if err != nil {
			t.Fatal(err)
		}
		offsets = append(offsets, a.Offset)
	}
	// Paging by any limit visits every batch once, whole, in order.
	for _, limit := range []int{1, 2, 3, 5, 100} {
		var seen []record.Offset
		off := record.Start
		for {
			res, err := db.Read(ctx, testKey, off, limit)
			if err != nil {
				t.Fatal(err)
			}
			records := 0
			for _, b := range res.Batches {
				seen = append(seen, b.Offset)
				records += b.Count
				if recs, err := b.Records.Decode(); err != nil || len(recs) != b.Count {
					t.Fatalf("batch %s: %d records, count %d, %v", b.Offset, len(recs), b.Count, err)
				}
			}
			if len(res.Batches) > 1 && records > limit {
				t.Fatalf("limit %d: read %d records in %d batches", limit, records, len(res.Batches))
			}
			off = res.NextOffset
			if res.UpToDate {
				break
			}
		}
		if len(seen) != len(offsets) {
			t.Fatalf("limit %d: saw %v, want %v", limit, seen, offsets)
		}
		for i := range seen {
			if seen[i] != offsets[i] {
				t.Fatalf("limit %d: saw %v, want %v", limit, seen, offsets)
			}
		}
	}
}

func TestReadOffsets(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	if _, err := db.Append(ctx, testKey, userEntry("a"), userEntry("b")); err != nil {
		t.Fatal(err)
	}
	absent := record.Key{Agent: "echo", Instance: "i1", Session: "nobody"}
	cases := []struct {
		name   string
		key    record.Key
		offset record.Offset
		want   error
	}{
		{"start", testKey, "0", nil},
		{"tail", testKey, "2", nil},
		{"inside a batch", testKey, "1", clog.ErrUnknownOffset},
		{"past the tail", testKey, "3", clog.ErrUnknownOffset},
		{"huge", testKey, "18446744073709551615", clog.ErrUnknownOffset},
		{"overflow", testKey, "18446744073709551616", clog.ErrInvalidOffset},
		{"leading zero", testKey, "02", clog.ErrInvalidOffset},
		{"negative", testKey, "-1", clog.ErrInvalidOffset},
		{"empty", testKey, "", clog.ErrInvalidOffset},
		{"absent start", absent, "0", nil},
		{"absent elsewhere", absent, "2", clog.ErrUnknownOffset},
		{"bad key", record.Key{Agent: "a b", Instance: "i", Session: "s"}, "0", clog.ErrInvalidName},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Read(ctx, tc.key, tc.offset, 0)
			if !errors.Is(err, tc.want) && !(tc.want == nil && err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	var oe *clog.OffsetError
	if _, err := db.Read(ctx, testKey, "1", 0); !errors.As(err, &oe) || oe.Incarnation == "" {
		t.Fatalf("offset error without incarnation: %v", err)
	}
}

func TestResetChangesIncarnation(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	sub, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("a")}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := db.Append(ctx, testKey, userEntry("b"))
	if err != nil {
		t.Fatal(err)
	}
	inc, err := db.Reset(ctx, testKey)
	if err != nil || inc == a.Incarnation {
		t.Fatalf("reset: %v %v", inc, err)
	}
	// The new incarnation holds only the settlement of the submission the
	// reset aborted: every submission keeps exactly one settlement.
	res, err := db.Read(ctx, testKey, record.Start, 0)
	if err != nil || res.Incarnation != inc || len(res.Batches) != 1 {
		t.Fatalf("after reset: %+v %v", res, err)
	}
	recs, _ := res.Batches[0].Records.Decode()
	if len(recs) != 1 || recs[0].Entry.Type != record.EntrySettlement || recs[0].Entry.SubmissionID != sub.ID || recs[0].Entry.ParentID != "" {
		t.Fatalf("after reset: %+v", recs)
	}
	if _, err := db.Read(ctx, testKey, a.NextOffset, 0); !errors.Is(err, clog.ErrUnknownOffset) {
		t.Fatalf("old offset: %v", err)
	}
	if s, _ := db.Submission(ctx, sub.ID); s.Status != record.StatusAborted || s.Error == nil || s.Error.Code != "stream_reset" {
		t.Fatalf("queued submission after reset: %+v", s)
	}
	// Old entry ids are forgotten: the new incarnation starts a fresh path.
	b, err := db.Append(ctx, testKey, userEntry("c"))
	if err != nil || b.Offset != res.NextOffset || b.Records[0].Entry.ParentID != recs[0].Entry.ID {
		t.Fatalf("append after reset: %+v %v", b, err)
	}
	// A reset with nothing unsettled leaves the new incarnation empty.
	if _, err := db.Reset(ctx, testKey); err != nil {
		t.Fatal(err)
	}
	if res, _ := db.Read(ctx, testKey, record.Start, 0); len(res.Batches) != 0 {
		t.Fatalf("empty reset: %+v", res)
	}
}

func TestTruncationMovesLeaf(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	a, _ := db.Append(ctx, testKey, userEntry("a"), userEntry("b"))
	first := a.Records[0].Entry.ID
	tr, err := db.Append(ctx, testKey, record.TruncatedRecord(first, "edit"), userEntry("b2"))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Records[0].NewLeafID != first || tr.Records[1].Entry.ParentID != first {
		t.Fatalf("truncation: %+v %+v", tr.Records[0], tr.Records[1].Entry)
	}
	root, err := db.Append(ctx, testKey, record.TruncatedRecord("", "clear"), userEntry("fresh"))
	if err != nil || root.Records[1].Entry.ParentID != "" {
		t.Fatalf("rewind to start: %+v %v", root, err)
	}
}

func TestWait(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)

	// An absent stream: waiting at "0" with no incarnation blocks until the
	// first append.
	woke := make(chan error, 1)
	go func() { woke <- db.Wait(ctx, testKey, record.Start, "") }()
	// Registered first, so that the window below follows the waiter's
	// check of the tail even on a loaded machine; a correct Wait never
	// returns in it, so the window can only miss a fault, not invent one.
	waitForWaiters(t, db, 1)
	select {
	case err := <-woke:
		t.Fatalf("woke before any append: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	a, err := db.Append(ctx, testKey, userEntry("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	// Behind the tail: returns at once.
	if err := db.Wait(ctx, testKey, record.Start, a.Incarnation); err != nil {
		t.Fatal(err)
	}
	// Cancellation.
	cctx, cancel := context.WithCancel(ctx)
	go func() { woke <- db.Wait(cctx, testKey, a.NextOffset, a.Incarnation) }()
	cancel()
	if err := <-woke; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	// Many waiters, one append wakes all.
	const n = 1000
	all := make(chan error, n)
	for range n {
		go func() { all <- db.Wait(ctx, testKey, a.NextOffset, a.Incarnation) }()
	}
	waitForWaiters(t, db, n)
	if _, err := db.Append(ctx, testKey, userEntry("y")); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-all; err != nil {
			t.Fatal(err)
		}
	}
}

// waitForWaiters waits until n wait on testKey's stream.
func waitForWaiters(t *testing.T, db *clog.DB, n int) {
	t.Helper()
	check.For(t, time.Minute, time.Millisecond, func() error {
		if got := clog.Waiters(db, testKey); got != n {
			return fmt.Errorf("%d waiters, want %d", got, n)
		}
		return nil
	})
}

func TestWaitEndsOnClose(t *testing.T) {
	db, err := clog.Open(t.TempDir()+"/db", nil)
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() { woke <- db.Wait(context.Background(), testKey, record.Start, "") }()
	waitForWaiters(t, db, 1)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-woke; !errors.Is(err, clog.ErrClosed) {
		t.Fatalf("wait after close: %v", err)
	}
	if _, err := db.Append(context.Background(), testKey, userEntry("x")); !errors.Is(err, clog.ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	if _, err := db.Read(context.Background(), testKey, record.Start, 0); !errors.Is(err, clog.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
}

func TestWriteExpectsIncarnation(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	a, err := db.Append(ctx, testKey, userEntry("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, Records: []record.Record{userEntry("b")}, Incarnation: a.Incarnation}); err != nil {
		t.Fatalf("same incarnation: %v", err)
	}
	if _, err := db.Reset(ctx, testKey); err != nil {
		t.Fatal(err)
	}
	_, err = db.Write(ctx, clog.Write{Key: testKey, Records: []record.Record{userEntry("late")}, Incarnation: a.Incarnation})
	if !errors.Is(err, clog.ErrIncarnationChanged) {
		t.Fatalf("old incarnation: %v", err)
	}
	absent := record.Key{Agent: "echo", Instance: "i1", Session: "absent"}
	if _, err := db.Write(ctx, clog.Write{Key: absent, Records: []record.Record{userEntry("x")}, Incarnation: a.Incarnation}); !errors.Is(err, clog.ErrIncarnationChanged) {
		t.Fatalf("absent stream: %v", err)
	}
}
