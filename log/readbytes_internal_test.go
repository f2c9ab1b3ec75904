package log

import (
	"context"
	"encoding/json"
	"github.com/convlog/convlog/log/record"
	"path/filepath"
	"strings"
	"testing"
)

// ReadBytes bounds a page by bytes, from the tail cache and from the store
// alike, and still returns a first batch larger than the bound whole.
func TestReadBytesBoundsThePage(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "convlog.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	rec := func(n int) record.Record {
		p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: strings.Repeat("x", n)}}})
		return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})
	}
	if _, err := db.Append(ctx, key, rec(5000)); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := db.Append(ctx, key, rec(100)); err != nil {
			t.Fatal(err)
		}
	}
	check := func(res record.ReadResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Batches) != 1 || res.UpToDate {
			t.Fatalf("a page over 1000 bytes starting with a 5000-byte batch has %d batches", len(res.Batches))
		}
	}
	check(db.ReadBytes(ctx, key, record.Start, 0, 1000))
	check(db.readStore(key, record.Start, 0, DefaultReadLimit, 1000))
	res, err := db.ReadBytes(ctx, key, res1(t, db, key), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Batches); n < 2 || n > 6 {
		t.Fatalf("%d batches of about 200 bytes in a 1000-byte page", n)
	}
	size := 0
	for _, b := range res.Batches {
		size += len(b.Records)
	}
	if size > 1000 {
		t.Fatalf("page of %d bytes over a 1000-byte bound", size)
	}
}

// res1 is the offset after the first batch.
func res1(t *testing.T, db *DB, key record.Key) record.Offset {
	res, err := db.Read(context.Background(), key, record.Start, 1)
	if err != nil {
		t.Fatal(err)
	}
	return res.NextOffset
}
