package log_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/convlog/convlog/internal/boltceiling"
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	bolt "go.etcd.io/bbolt"
)

// The append benchmarks and the bare-bbolt ceilings run side by side in one
// `go test -bench . ./log/` so their ratio is measured under the same noise.
// Each op is one durable append (or put) of one 256-byte record.

const benchRecordBytes = 256

func benchPayload() json.RawMessage {
	// A message payload whose stored record comes to about 256 bytes.
	text := bytes.Repeat([]byte("x"), benchRecordBytes-150)
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: string(text)}}})
	return p
}

// runWriters spreads b.N operations over n goroutines and reports ops/s.
func runWriters(b *testing.B, n int, op func(writer, i int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	b.ResetTimer()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(w, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}

func BenchmarkAppend(b *testing.B) {
	payload := benchPayload()
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("convlog/writers=%d", writers), func(b *testing.B) {
			db := openTestDB(b, nil)
			ctx := context.Background()
			runWriters(b, writers, func(w, _ int) error {
				key := record.Key{Agent: "bench", Instance: "i", Session: "s" + strconv.Itoa(w)}
				_, err := db.Append(ctx, key, record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: payload}))
				return err
			})
			commits, writes := db.CommitStats()
			b.ReportMetric(float64(writes)/float64(max(commits, 1)), "writes/commit")
		})
	}
	// Admission is what a POST costs the log: the entry, its submission,
	// queue and outbox entries, the instance index. Next to the ceilings,
	// so that its ratio to them comes from one run.
	b.Run("convlog-admit/writers=64", func(b *testing.B) {
		db := openTestDB(b, nil)
		ctx := context.Background()
		runWriters(b, 64, func(w, _ int) error {
			key := record.Key{Agent: "bench", Instance: "i" + strconv.Itoa(w), Session: "s"}
			_, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: payload})}})
			return err
		})
		commits, writes := db.CommitStats()
		b.ReportMetric(float64(writes)/float64(max(commits, 1)), "writes/commit")
	})
	// The ceilings: bare bbolt, the same record size, no engine logic.
	value := bytes.Repeat([]byte("x"), benchRecordBytes)
	b.Run("bbolt-batch-max64/writers=64", func(b *testing.B) {
		bdb := openBolt(b)
		bdb.MaxBatchSize = 64
		runWriters(b, 64, func(w, i int) error {
			return bdb.Batch(func(tx *bolt.Tx) error {
				return tx.Bucket(boltceiling.Bucket).Put(benchKey(w, i), value)
			})
		})
	})
	b.Run("bbolt-groupcommit/writers=64", func(b *testing.B) {
		bdb := openBolt(b)
		gc := boltceiling.New(bdb)
		defer gc.Close()
		runWriters(b, 64, func(w, i int) error { return gc.Put(benchKey(w, i), value) })
	})
}

func openBolt(b *testing.B) *bolt.DB {
	bdb, err := boltceiling.Open(filepath.Join(b.TempDir(), "bare.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bdb.Close() })
	return bdb
}

func benchKey(w, i int) []byte {
	k := make([]byte, 16)
	binary.BigEndian.PutUint64(k, uint64(w))
	binary.BigEndian.PutUint64(k[8:], uint64(i))
	return k
}

// catchUpDB is one 1,000,000-record stream, built once for the read
// benchmarks in batches of 10 records.
var catchUp struct {
	once sync.Once
	dir  string
	db   *clog.DB
	err  error
}

const catchUpRecords = 1_000_000

var catchUpKey = record.Key{Agent: "bench", Instance: "i", Session: "long"}

func catchUpDB(b *testing.B) *clog.DB {
	catchUp.once.Do(func() {
		dir, err := tmpDir()
		if err != nil {
			catchUp.err = err
			return
		}
		catchUp.dir = dir
		db, err := clog.Open(filepath.Join(dir, "long.db"), nil)
		if err != nil {
			catchUp.err = err
			return
		}
		catchUp.db = db
		payload := benchPayload()
		const perBatch = 10
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				recs := make([]record.Record, perBatch)
				for next.Add(perBatch) <= catchUpRecords {
					for j := range recs {
						recs[j] = record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: payload})
					}
					if _, err := db.Append(context.Background(), catchUpKey, recs...); err != nil {
						catchUp.err = err
						return
					}
				}
			}()
		}
		wg.Wait()
	})
	if catchUp.err != nil {
		b.Fatal(catchUp.err)
	}
	return catchUp.db
}

func BenchmarkCatchUp(b *testing.B) {
	db := catchUpDB(b)
	ctx := context.Background()
	// The middle: walk to the batch that holds record 500,000.
	middle := record.Start
	for seen := 0; seen < catchUpRecords/2; {
		res, err := db.Read(ctx, catchUpKey, middle, clog.MaxReadLimit)
		if err != nil {
			b.Fatal(err)
		}
		for _, bt := range res.Batches {
			seen += bt.Count
		}
		middle = res.NextOffset
	}
	for _, from := range []struct {
		name   string
		offset record.Offset
	}{{"from=0", record.Start}, {"from=middle", middle}} {
		b.Run(from.name, func(b *testing.B) {
			// Each op reads one page of up to MaxReadLimit records.
			records := 0
			off := from.offset
			for b.Loop() {
				res, err := db.Read(ctx, catchUpKey, off, clog.MaxReadLimit)
				if err != nil {
					b.Fatal(err)
				}
				for _, bt := range res.Batches {
					records += bt.Count
				}
				off = res.NextOffset
				if res.UpToDate {
					off = from.offset
				}
			}
			b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
