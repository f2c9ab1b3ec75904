package worker_test

import (
	"context"
	"path/filepath"
	"testing"

	clog "github.com/convlog/convlog/log"
)

// A process that died mid-turn left a running submission and an admitted
// one behind it. The next start settles the first failed "interrupted"
// without re-running it, then runs the second.
func TestRecoverySettlesInterruptedTurns(t *testing.T) {
	dir := t.TempDir()
	key := clog.Key{Agent: "echo", Instance: "i", Session: "s"}
	db, err := clog.Open(filepath.Join(dir, "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	running, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []clog.Record{userRecord("was running")}})
	if err != nil {
		t.Fatal(err)
	}
	waiting, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []clog.Record{userRecord("was waiting")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: key, Start: []string{running.ID}, TurnID: "turn_dead"}); err != nil {
		t.Fatal(err)
	}
	// The outbox is published: only the log knows about the waiting one.
	if err := db.MarkPublished(ctx, running.ID, waiting.ID); err != nil {
		t.Fatal(err)
	}
	db.Close()

	r := startRigIn(t, dir, nil)
	got := r.settled(t, running.ID)
	if got.Status != clog.StatusFailed || got.Error == nil || got.Error.Code != "interrupted" || !got.Error.Retryable {
		t.Fatalf("interrupted: %+v %+v", got, got.Error)
	}
	if got := r.settled(t, waiting.ID); got.Status != clog.StatusCompleted {
		t.Fatalf("waiting: %+v", got)
	}
	// Exactly one settlement each, and the interrupted one has no reply.
	settlements := map[string]int{}
	for _, rec := range r.records(t, key) {
		if rec.Entry.Type == clog.EntrySettlement {
			settlements[rec.Entry.SubmissionID]++
		}
		if rec.Entry.Type == clog.EntryAssistantMessage && rec.Entry.SubmissionID == running.ID {
			t.Fatalf("interrupted submission was re-run: %+v", rec.Entry)
		}
	}
	if settlements[running.ID] != 1 || settlements[waiting.ID] != 1 {
		t.Fatalf("settlements %v", settlements)
	}
}
