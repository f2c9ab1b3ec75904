package log_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

type countingObserver struct {
	commits, writes atomic.Int64
	sync            atomic.Int64 // nanoseconds
}

func (o *countingObserver) Committed(writes int, total, sync time.Duration) {
	o.commits.Add(1)
	o.writes.Add(int64(writes))
	o.sync.Add(int64(sync))
}

func TestObserverAndBacklog(t *testing.T) {
	ctx := context.Background()
	obs := &countingObserver{}
	db := openTestDB(t, &clog.Options{Observer: obs})
	for i := 0; i < 3; i++ {
		if _, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("hi")}}); err != nil {
			t.Fatal(err)
		}
	}
	if obs.commits.Load() < 1 || obs.writes.Load() < 3 || obs.sync.Load() <= 0 {
		t.Fatalf("observer saw commits %d writes %d sync %v", obs.commits.Load(), obs.writes.Load(), time.Duration(obs.sync.Load()))
	}
	b, err := db.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Outbox != 3 || b.Unsettled != 3 {
		t.Fatalf("backlog = %+v, want 3 and 3", b)
	}
}

// TestBackupWhileWritingRestore copies the log while writers go on, and
// restores it: the copy is a prefix of what was written, consistent, and
// its streams get new incarnations unless told otherwise.
func TestBackupWhileWritingRestore(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	first, err := db.Append(ctx, testKey, userEntry("before"))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := db.Append(ctx, testKey, userEntry("during")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var buf bytes.Buffer
	var size int64
	n, err := db.Backup(ctx, func(s int64) (io.Writer, error) { size = s; return &buf, nil })
	close(stop)
	wg.Wait()
	if err != nil || n != size || int64(buf.Len()) != size {
		t.Fatalf("backup: n %d size %d len %d err %v", n, size, buf.Len(), err)
	}

	dir := t.TempDir()
	dst := filepath.Join(dir, "convlog.db")
	res, err := clog.Restore(ctx, bytes.NewReader(buf.Bytes()), dst, clog.RestoreOptions{})
	if err != nil || res.Streams != 1 || res.Renewed != 1 {
		t.Fatalf("restore: %+v %v", res, err)
	}
	if _, err := clog.Restore(ctx, bytes.NewReader(buf.Bytes()), dst, clog.RestoreOptions{}); err == nil {
		t.Fatal("restore over an existing file without Replace succeeded")
	}
	r, err := clog.Open(dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Read(ctx, testKey, record.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Incarnation == first.Incarnation || got.Incarnation == "" {
		t.Fatalf("restored incarnation %q, the original was %q: want a new one", got.Incarnation, first.Incarnation)
	}
	if len(got.Batches) == 0 {
		t.Fatal("restored stream is empty")
	}
	recs, _ := got.Batches[0].Records.Decode()
	if recs[0].Entry.ID != first.Records[0].Entry.ID {
		t.Fatalf("first restored entry %q, want %q", recs[0].Entry.ID, first.Records[0].Entry.ID)
	}
	// Restoring over a file a process has open is refused.
	if _, err := clog.Restore(ctx, bytes.NewReader(buf.Bytes()), dst, clog.RestoreOptions{Replace: true}); !errors.Is(err, clog.ErrLocked) {
		t.Fatalf("restore over an open log: %v, want ErrLocked", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := clog.Restore(ctx, bytes.NewReader(buf.Bytes()), dst, clog.RestoreOptions{Replace: true, KeepIncarnations: true}); err != nil {
		t.Fatal(err)
	}
	r, err = clog.Open(dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	inc, _, err := r.Tail(ctx, testKey)
	if err != nil || inc != first.Incarnation {
		t.Fatalf("kept incarnation %q %v, want %q", inc, err, first.Incarnation)
	}
}
