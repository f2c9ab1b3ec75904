package log

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/convlog/convlog/log/record"
)

func getSubmission(tx *bolt.Tx, id string) (*storedSubmission, error) {
	v := tx.Bucket(bucketSubmissions).Get([]byte(id))
	if v == nil {
		return nil, fmt.Errorf("%w: %s", ErrSubmissionNotFound, record.Clip(id, 40))
	}
	var s storedSubmission
	if err := decodeSubmission(v, &s); err != nil {
		return nil, fmt.Errorf("submission %s: %w", id, err)
	}
	s.Key = record.Key{Agent: s.Agent, Instance: s.Instance, Session: s.Session}
	return &s, nil
}

func putSubmission(tx *bolt.Tx, s *storedSubmission) error {
	s.Agent, s.Instance, s.Session = s.Key.Agent, s.Key.Instance, s.Key.Session
	s.derivePending()
	return tx.Bucket(bucketSubmissions).Put([]byte(s.ID), encodeSubmission(s))
}

// Submission returns the submission with that id.
func (db *DB) Submission(ctx context.Context, id string) (record.Submission, error) {
	if err := ctx.Err(); err != nil {
		return record.Submission{}, err
	}
	var s *storedSubmission
	err := db.view(func(tx *bolt.Tx) (err error) {
		s, err = getSubmission(tx, id)
		return err
	})
	if err != nil {
		return record.Submission{}, err
	}
	return s.Submission, nil
}

// Pending returns the stream's unsettled submissions (admitted, running
// or input_required) in admission order.
func (db *DB) Pending(ctx context.Context, key record.Key) ([]record.Submission, error) {
	return db.pending(ctx, key, math.MaxInt)
}

// PendingFirst returns the stream's first limit unsettled submissions
// (admitted, running or input_required) in admission order: what a turn
// may take, without loading a backlog of any size.
func (db *DB) PendingFirst(ctx context.Context, key record.Key, limit int) ([]record.Submission, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("pending %s: %w: limit %d", key, ErrInvalidRecord, limit)
	}
	return db.pending(ctx, key, limit)
}

func (db *DB) pending(ctx context.Context, key record.Key, limit int) ([]record.Submission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []record.Submission
	err := db.view(func(tx *bolt.Tx) (err error) {
		meta, ok, err := loadStream(tx, key)
		if err != nil || !ok {
			return err
		}
		out, err = submissionsUnder(tx, bucketQueue, u64(meta.id), limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pending %s: %w", key, err)
	}
	return out, nil
}

// Unsettled returns up to limit unsettled submissions of all streams, in
// stream order then admission order. Recovery after a crash walks it.
func (db *DB) Unsettled(ctx context.Context, limit int) ([]record.Submission, error) {
	return db.scanIDs(ctx, bucketQueue, limit)
}

// Unpublished returns up to limit admitted (or resumed, see Decide)
// submissions that have not been marked published, oldest first: the
// outbox a relay drains.
func (db *DB) Unpublished(ctx context.Context, limit int) ([]record.Submission, error) {
	return db.scanIDs(ctx, bucketOutbox, limit)
}

func (db *DB) scanIDs(ctx context.Context, bucket []byte, limit int) ([]record.Submission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []record.Submission
	err := db.view(func(tx *bolt.Tx) (err error) {
		out, err = submissionsUnder(tx, bucket, nil, limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", bucket, err)
	}
	return out, nil
}

// submissionsUnder loads up to limit submissions whose ids are the values
// of bucket's keys starting with prefix, in key order.
func submissionsUnder(tx *bolt.Tx, bucket, prefix []byte, limit int) ([]record.Submission, error) {
	var out []record.Submission
	c := tx.Bucket(bucket).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, v = c.Next() {
		s, err := getSubmission(tx, string(v))
		if err != nil {
			return nil, err
		}
		out = append(out, s.Submission)
	}
	return out, nil
}

// MarkPublished removes submissions from the outbox. Unknown or already
// published ids are ignored, so a relay may repeat itself.
func (db *DB) MarkPublished(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	op := &write{prepare: func(tx *bolt.Tx, _ time.Time, _ *commitNotes) (func() error, []byte, error) {
		var seqs []uint64
		for _, id := range ids {
			s, err := getSubmission(tx, id)
			if err != nil {
				continue
			}
			seqs = append(seqs, s.Seq)
		}
		return func() error {
			outbox := tx.Bucket(bucketOutbox)
			for _, seq := range seqs {
				if err := outbox.Delete(u64(seq)); err != nil {
					return err
				}
			}
			return nil
		}, nil, nil
	}}
	if err := db.submit(ctx, op); err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	return nil
}

// ExpireIdempotencyKeys forgets up to max keys older than the TTL and
// reports how many it removed. Call it periodically.
func (db *DB) ExpireIdempotencyKeys(ctx context.Context, max int) (int, error) {
	var n int
	op := &write{prepare: func(tx *bolt.Tx, now time.Time, notes *commitNotes) (func() error, []byte, error) {
		n = 0
		cutoff := uint64(now.Add(-db.opts.IdempotencyTTL).UnixNano())
		var expired [][]byte
		c := tx.Bucket(bucketIdemExpiry).Cursor()
		for k, _ := c.First(); k != nil && len(expired) < max && binary.BigEndian.Uint64(k) < cutoff; k, _ = c.Next() {
			expired = append(expired, append([]byte(nil), k...))
		}
		return func() error {
			idem, exp := tx.Bucket(bucketIdem), tx.Bucket(bucketIdemExpiry)
			for _, k := range expired {
				// A key re-admitted after expiry has a newer record: keep it.
				if v := idem.Get(k[8:]); v != nil {
					var rec idemRecord
					if json.Unmarshal(v, &rec) == nil && uint64(rec.At.UnixNano()) == binary.BigEndian.Uint64(k) {
						if err := idem.Delete(k[8:]); err != nil {
							return err
						}
					}
				}
				if err := exp.Delete(k); err != nil {
					return err
				}
			}
			n = len(expired)
			return nil
		}, nil, nil
	}}
	if err := db.submit(ctx, op); err != nil {
		return 0, fmt.Errorf("expire idempotency keys: %w", err)
	}
	return n, nil
}
