package log_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
)

func admitText(t *testing.T, db *clog.DB, key record.Key, text string) record.Submission {
	t.Helper()
	sub, _, err := db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userEntry(text)}})
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

func readAllRecords(t *testing.T, db *clog.DB, key record.Key) (record.ReadResult, []record.Record) {
	t.Helper()
	res, err := db.Read(context.Background(), key, record.Start, clog.MaxReadLimit)
	if err != nil {
		t.Fatal(err)
	}
	var recs []record.Record
	for _, b := range res.Batches {
		rs, err := b.Records.Decode()
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rs...)
	}
	return res, recs
}

func userTexts(recs []record.Record) []string {
	var out []string
	for _, m := range projection.Project(recs).Messages {
		out = append(out, m.Parts[0].Text)
	}
	return out
}

func TestChangeRewindRegenerateFork(t *testing.T) {
	db := openTestDB(t, nil)
	ctx := context.Background()
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	s1 := admitText(t, db, key, "one")
	s2 := admitText(t, db, key, "two")
	s3 := admitText(t, db, key, "three")
	cps, err := db.Checkpoints(ctx, key)
	if err != nil || len(cps) != 3 || cps[1].SubmissionID != s2.ID || cps[2].Preview != "three" {
		t.Fatalf("checkpoints %+v %v", cps, err)
	}
	// Rewind to before "two": all three are unsettled (no worker here), and
	// settle aborted in the rewind's batch, before its truncation.
	res, replayed, err := db.Change(ctx, clog.Change{Kind: clog.ChangeRewind, Key: key, EntryID: cps[1].EntryID, IdempotencyKey: "k", RequestHash: "h"})
	if err != nil || replayed || res.Kind != clog.ChangeRewind || res.LeafID == "" || len(res.Aborted) != 3 {
		t.Fatalf("rewind %+v %v %v", res, replayed, err)
	}
	again, replayed, err := db.Change(ctx, clog.Change{Kind: clog.ChangeRewind, Key: key, EntryID: cps[1].EntryID, IdempotencyKey: "k", RequestHash: "h"})
	if err != nil || !replayed || again.Offset != res.Offset {
		t.Fatalf("replay %+v %v %v", again, replayed, err)
	}
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeReset, Key: key, IdempotencyKey: "k", RequestHash: "other"}); !errors.Is(err, clog.ErrIdempotencyKeyReused) {
		t.Fatalf("key reused: %v", err)
	}
	for _, id := range []string{s1.ID, s2.ID, s3.ID} {
		if s, _ := db.Submission(ctx, id); s.Status != record.StatusAborted || s.Error.Code != "rewound" {
			t.Fatalf("%s after rewind: %+v", id, s)
		}
	}
	_, recs := readAllRecords(t, db, key)
	if got := userTexts(recs); len(got) != 1 || got[0] != "one" {
		t.Fatalf("after rewind %v", got)
	}
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeRewind, Key: key, EntryID: cps[2].EntryID}); !errors.Is(err, clog.ErrNotOnPath) {
		t.Fatalf("off the path: %v", err)
	}
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeRewind, Key: key, EntryID: "nope"}); !errors.Is(err, clog.ErrUnknownEntry) {
		t.Fatalf("unknown: %v", err)
	}

	// Appends between the read outside the commit and the commit are
	// seen: many of them, then a rewind to the newest message.
	for range 50 {
		admitText(t, db, key, "more")
	}
	last := admitText(t, db, key, "last")
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeRewind, Key: key, EntryID: last.EntryID}); err != nil {
		t.Fatal(err)
	}
	// Regenerate the last user message: a new submission, queued and in
	// the outbox, its message the same.
	res, _, err = db.Change(ctx, clog.Change{Kind: clog.ChangeRegenerate, Key: key})
	if err != nil || res.Submission == nil || res.Submission.Status != record.StatusAdmitted {
		t.Fatalf("regenerate %+v %v", res, err)
	}
	if pending, _ := db.Pending(ctx, key); len(pending) != 1 || pending[0].ID != res.Submission.ID {
		t.Fatalf("pending %+v", pending)
	}
	out, _ := db.Unpublished(ctx, 1000)
	if out[len(out)-1].ID != res.Submission.ID {
		t.Fatalf("outbox ends with %+v", out[len(out)-1])
	}
	_, recs = readAllRecords(t, db, key)
	got := userTexts(recs)
	if len(got) != 51 || got[0] != "one" || got[50] != "more" {
		t.Fatalf("after regenerate: %d messages, %v…", len(got), got[:2])
	}

	// Fork the path up to the first message into another instance.
	fk, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeFork, Key: key, EntryID: cps[0].EntryID, Target: record.Key{Agent: "a", Instance: "j", Session: "default"}})
	if err != nil || fk.UID == "" || fk.UID == s1.UID {
		t.Fatalf("fork %+v %v", fk, err)
	}
	_, frecs := readAllRecords(t, db, record.Key{Agent: "a", Instance: "j", Session: "default"})
	if got := userTexts(frecs); len(got) != 1 || got[0] != "one" || frecs[0].Entry.Type != clog.EntryForked {
		t.Fatalf("fork %v", got)
	}
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeFork, Key: key, EntryID: cps[0].EntryID, Target: record.Key{Agent: "a", Instance: "j", Session: "x"}}); !errors.Is(err, clog.ErrConflict) {
		t.Fatalf("fork into an existing instance: %v", err)
	}
}

func TestChangeDeleteAndPurge(t *testing.T) {
	db := openTestDB(t, nil)
	ctx := context.Background()
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	done := admitText(t, db, key, "one")
	if _, err := db.Write(ctx, clog.Write{Key: key, Settle: []record.Settlement{{SubmissionID: done.ID, Outcome: record.OutcomeCompleted}}}); err != nil {
		t.Fatal(err)
	}
	queued := admitText(t, db, key, "two")
	changed, release := db.Changed(key)
	defer release()
	res, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeDelete, Key: key})
	if err != nil || res.UID != done.UID || len(res.Aborted) != 1 || res.Aborted[0] != queued.ID {
		t.Fatalf("delete %+v %v", res, err)
	}
	select {
	case <-changed: // a reader waiting on the stream is woken
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up")
	}
	if r, _ := readAllRecords(t, db, key); r.Incarnation != "" || len(r.Batches) != 0 {
		t.Fatalf("after delete %+v", r)
	}
	if s, err := db.Submission(ctx, queued.ID); err != nil || s.Status != record.StatusAborted || s.Error.Code != "deleted" {
		t.Fatalf("kept submission %+v %v", s, err)
	}
	var se *clog.StaleGenerationError
	if _, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userEntry("x")}, UID: done.UID}); !errors.As(err, &se) || se.Current != "" {
		t.Fatalf("old uid: %v", err)
	}
	if list, _, _ := db.Instances(ctx, "a", "", 10); len(list) != 0 {
		t.Fatalf("listed after delete: %+v", list)
	}
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeDelete, Key: key}); !errors.Is(err, clog.ErrInstanceNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	// A new generation, then a purge: records and submissions go.
	reborn := admitText(t, db, key, "again")
	if reborn.UID == done.UID {
		t.Fatal("same uid after delete")
	}
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeDelete, Key: key, Purge: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Submission(ctx, reborn.ID); !errors.Is(err, clog.ErrSubmissionNotFound) {
		t.Fatalf("purged submission: %v", err)
	}
	if pending, _ := db.Unsettled(ctx, 100); len(pending) != 0 {
		t.Fatalf("unsettled after purge %+v", pending)
	}
}
