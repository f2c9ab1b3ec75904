package log

import (
	"context"
	"encoding/json"
	"github.com/convlog/convlog/log/record"
	"path/filepath"
	"testing"
	"time"
)

// A submission's status never runs ahead of its stream: once a read of
// the status says it is settled, a read of the stream, served by the tail
// cache while someone follows the stream, holds its settlement. The hook
// holds the committer between bbolt's commit and the cache's update, the
// window where the two read paths disagreed (issue 21: "completed" with
// the conversation showing only the user message).
func TestStatusNeverAheadOfStream(t *testing.T) {
	db, key := openWidened(t)
	ctx := context.Background()
	text := func(s string) record.Record {
		p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: s}}})
		return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})
	}
	for i := range 20 {
		sub, _, err := db.Admit(ctx, Admission{Key: key, Records: []record.Record{text("q")}})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := db.Write(ctx, Write{Key: key, Records: []record.Record{text("a")},
				Settle: []record.Settlement{{SubmissionID: sub.ID, Outcome: record.OutcomeCompleted}}})
			done <- err
		}()
		for {
			s, err := db.Submission(ctx, sub.ID)
			if err != nil {
				t.Fatal(err)
			}
			if s.Status.Terminal() {
				break
			}
		}
		res, err := db.Read(ctx, key, record.Start, 100000)
		if err != nil {
			t.Fatal(err)
		}
		if !settledIn(t, res, sub.ID) {
			t.Fatalf("round %d: %s is %s, but the stream (next %s) has no settlement for it", i, sub.ID, record.OutcomeCompleted, res.NextOffset)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func settledIn(t *testing.T, res record.ReadResult, id string) bool {
	t.Helper()
	for _, b := range res.Batches {
		recs, err := b.Records.Decode()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Entry != nil && r.Entry.Type == record.EntrySettlement && r.Entry.SubmissionID == id {
				return true
			}
		}
	}
	return false
}

// A worker that finds a submission in the backlog finds its message at
// its offset: the spurious "prompt_unreadable" ("no records at its
// offset") on NATS clusters was the same window as above.
func TestPendingNeverAheadOfStream(t *testing.T) {
	db, key := openWidened(t)
	ctx := context.Background()
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: "q"}}})
	for i := range 20 {
		done := make(chan error, 1)
		go func() {
			_, _, err := db.Admit(ctx, Admission{Key: key, Records: []record.Record{record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})}})
			done <- err
		}()
		var sub record.Submission
		for sub.ID == "" {
			subs, err := db.PendingFirst(ctx, key, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(subs) > 0 {
				sub = subs[0]
			}
		}
		res, err := db.Read(ctx, key, sub.Offset, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Batches) == 0 {
			t.Fatalf("round %d: %s is pending, but its offset %s reads nothing", i, sub.ID, sub.Offset)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if _, err := db.Write(ctx, Write{Key: key, Settle: []record.Settlement{{SubmissionID: sub.ID, Outcome: record.OutcomeCompleted}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// openWidened opens a log whose committer pauses between bbolt's commit
// and the tail cache's update, with a follower of key so that reads come
// from the cache.
func openWidened(t *testing.T) (*DB, record.Key) {
	t.Helper()
	db, err := Open(filepath.Join(t.TempDir(), "convlog.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	testHookCommitted = func() { time.Sleep(2 * time.Millisecond) }
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	_, release := db.Changed(key)
	t.Cleanup(func() {
		release()
		db.Close()
		testHookCommitted = nil // after the committer has stopped
	})
	return db, key
}
