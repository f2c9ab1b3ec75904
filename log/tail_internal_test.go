package log

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/convlog/convlog/log/record"
	"pgregory.net/rapid"
)

// Reads served by the tail cache are exactly what bbolt would serve, across
// appends of any size, resets, subscribers coming and going, and offsets
// old and new.
func TestTailCacheMatchesStore(t *testing.T) {
	dir := t.TempDir()
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		db, err := Open(filepath.Join(dir, fmt.Sprint(n, ".db")), nil)
		if err != nil {
			rt.Fatal(err)
		}
		defer db.Close()
		ctx := context.Background()
		key := record.Key{Agent: "a", Instance: "i", Session: "s"}
		var offsets []record.Offset // every offset produced, any incarnation
		offsets = append(offsets, record.Start)
		var releases []func()
		defer func() {
			for _, r := range releases {
				r()
			}
		}()
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0:
				_, release := db.Changed(key)
				releases = append(releases, release)
			case 1:
				if len(releases) > 0 {
					releases[0]()
					releases = releases[1:]
				}
			case 2:
				if _, err := db.Reset(ctx, key); err != nil {
					rt.Fatal(err)
				}
			default:
				recs := make([]record.Record, rapid.IntRange(1, 5).Draw(rt, "records"))
				for i := range recs {
					recs[i] = record.EntryRecord(record.Entry{Type: "t", Payload: []byte(`{"x":1}`)})
				}
				a, err := db.Append(ctx, key, recs...)
				if err != nil {
					rt.Fatal(err)
				}
				offsets = append(offsets, a.Offset, a.NextOffset)
			}
			off := rapid.SampledFrom(offsets).Draw(rt, "offset")
			limit := rapid.IntRange(1, 12).Draw(rt, "limit")
			got, gerr := db.Read(ctx, key, off, limit)
			pos, _ := off.Position()
			want, werr := db.readStore(key, off, pos, limit, MaxReadBytes)
			if (gerr == nil) != (werr == nil) {
				rt.Fatalf("read %s limit %d: cache err %v, store err %v", off, limit, gerr, werr)
			}
			if gerr == nil && !reflect.DeepEqual(normal(got), normal(want)) {
				rt.Fatalf("read %s limit %d:\ncache %+v\nstore %+v", off, limit, got, want)
			}
			gi, gt, _ := db.Tail(ctx, key)
			if gerr == nil && gi != want.Incarnation && want.Incarnation != "" {
				rt.Fatalf("tail incarnation %s, store %s", gi, want.Incarnation)
			}
			_ = gt
		}
	})
}

// normal makes results comparable: batches' bytes as strings.
func normal(r record.ReadResult) any {
	type b struct {
		Offset  record.Offset
		Count   int
		Records string
	}
	var bs []b
	for _, x := range r.Batches {
		bs = append(bs, b{x.Offset, x.Count, string(x.Records)})
	}
	return []any{r.Incarnation, bs, r.NextOffset, r.UpToDate, r.Remaining}
}
