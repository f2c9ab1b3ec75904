package log_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// openTestDB opens a log in a fresh temp folder and closes it with the test.
func openTestDB(t testing.TB, opts *clog.Options) *clog.DB {
	t.Helper()
	db, err := clog.Open(filepath.Join(t.TempDir(), "convlog.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

func userEntry(text string) record.Record {
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})
}

var testKey = record.Key{Agent: "echo", Instance: "i1", Session: "default"}

func TestAppendReadRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)

	res, err := db.Read(ctx, testKey, record.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Incarnation != "" || len(res.Batches) != 0 || res.NextOffset != record.Start || !res.UpToDate {
		t.Fatalf("absent stream read = %+v", res)
	}
	a1, err := db.Append(ctx, testKey, userEntry("one"), userEntry("two"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := db.Append(ctx, testKey, userEntry("three"))
	if err != nil {
		t.Fatal(err)
	}
	if a1.Offset != record.Start || a2.Offset != a1.NextOffset || a1.Incarnation != a2.Incarnation {
		t.Fatalf("offsets: %+v %+v", a1, a2)
	}
	if got, want := a2.Records[0].Entry.ParentID, a1.Records[1].Entry.ID; got != want {
		t.Fatalf("parent = %q, want leaf %q", got, want)
	}
	res, err = db.Read(ctx, testKey, record.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Batches) != 2 || res.NextOffset != a2.NextOffset || !res.UpToDate || res.Incarnation != a1.Incarnation {
		t.Fatalf("read = %+v", res)
	}
	recs, err := res.Batches[1].Records.Decode()
	if err != nil || len(recs) != 1 || recs[0].Entry.ID != a2.Records[0].Entry.ID {
		t.Fatalf("decoded %v %v", recs, err)
	}
	if _, err := db.Read(ctx, testKey, "1", 0); !errors.Is(err, clog.ErrUnknownOffset) {
		t.Fatalf("mid-batch offset: %v", err)
	}
}
