package log

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

// Reset gives the stream a new incarnation and removes its records. Its
// unsettled submissions are settled aborted (code "stream_reset"), and the
// new incarnation starts with their settlement entries, so that every
// submission still has exactly one settlement in its stream. Resetting an
// absent stream creates it, empty.
func (db *DB) Reset(ctx context.Context, key record.Key) (record.Incarnation, error) {
	if err := key.Validate(); err != nil {
		return "", fmt.Errorf("reset %s: %w", key, err)
	}
	var inc record.Incarnation
	op := &write{prepare: func(tx *bolt.Tx, now time.Time, notes *commitNotes) (func() error, []byte, error) {
		meta, ok, err := loadStream(tx, key)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			meta = newStream(now)
		}
		old := meta.id
		meta.inc, meta.next, meta.leaf = ulid.Make(), 0, ""
		return func() error {
			var settled []record.Record
			if old != 0 {
				if err := deleteRecords(tx, old); err != nil {
					return err
				}
				if err := forgetTurnCount(tx, old); err != nil {
					return err
				}
				if settled, err = abortQueued(tx, old, now); err != nil {
					return err
				}
			}
			if err := meta.store(tx, key); err != nil {
				return err
			}
			notes.reset(key, meta)
			if len(settled) > 0 {
				plan, err := planAppend(tx, key, meta, settled, now)
				if err != nil {
					return err
				}
				if err := plan.store(tx, notes); err != nil {
					return err
				}
			}
			inc = incarnationOf(meta.inc)
			return nil
		}, encodeKey(key), nil
	}}
	if err := db.submit(ctx, op); err != nil {
		return "", fmt.Errorf("reset %s: %w", key, err)
	}
	return inc, nil
}

// deleteRecords removes a stream's batches and the index of their entries.
func deleteRecords(tx *bolt.Tx, streamID uint64) error {
	entries := tx.Bucket(bucketEntries)
	var ids []string
	if err := streamEntries(tx, streamID, func(id, _ string) { ids = append(ids, id) }); err != nil {
		return err
	}
	for _, id := range ids {
		if err := entries.Delete(entryKey(streamID, id)); err != nil {
			return err
		}
	}
	return deletePrefix(tx.Bucket(bucketBatches), u64(streamID))
}

// streamEntries calls fn with the id and submission id of every entry
// stored for the stream, in stream order.
func streamEntries(tx *bolt.Tx, streamID uint64, fn func(id, submissionID string)) error {
	c := tx.Bucket(bucketBatches).Cursor()
	for k, v := c.Seek(u64(streamID)); k != nil && binary.BigEndian.Uint64(k) == streamID; k, v = c.Next() {
		_, array, err := decodeBatchHeader(v)
		if err != nil {
			return err
		}
		var recs []struct {
			Entry *struct {
				ID           string `json:"id"`
				SubmissionID string `json:"submissionId"`
			} `json:"entry"`
		}
		if err := json.Unmarshal(array, &recs); err != nil {
			return err
		}
		for _, r := range recs {
			if r.Entry != nil {
				fn(r.Entry.ID, r.Entry.SubmissionID)
			}
		}
	}
	return nil
}

// deletePrefix collects, then deletes: deleting under a cursor skips keys.
func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// abortQueued settles the stream's unsettled submissions aborted and
// returns their settlement entries.
func abortQueued(tx *bolt.Tx, streamID uint64, now time.Time) ([]record.Record, error) {
	queue := tx.Bucket(bucketQueue)
	var ids []string
	c := queue.Cursor()
	for k, v := c.Seek(u64(streamID)); k != nil && binary.BigEndian.Uint64(k) == streamID; k, v = c.Next() {
		ids = append(ids, string(v))
	}
	var settled []record.Record
	for _, id := range ids {
		s, err := getSubmission(tx, id)
		if err != nil {
			return nil, err
		}
		s.Status, s.SettledAt = record.StatusAborted, now
		s.Error = &record.Failure{Code: "stream_reset", Message: "the stream was reset before the submission settled"}
		if err := putSubmission(tx, s); err != nil {
			return nil, err
		}
		// Nothing left to deliver: no doorbell either.
		if err := tx.Bucket(bucketOutbox).Delete(u64(s.Seq)); err != nil {
			return nil, err
		}
		payload, err := json.Marshal(record.Settlement{SubmissionID: id, Outcome: record.OutcomeAborted, Error: s.Error})
		if err != nil {
			return nil, err
		}
		settled = append(settled, record.EntryRecord(record.Entry{Type: record.EntrySettlement, SubmissionID: id, TurnID: s.TurnID, Payload: payload}))
	}
	return settled, deletePrefix(queue, u64(streamID))
}
