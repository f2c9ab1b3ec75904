package log

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/convlog/convlog/log/record"
	bolt "go.etcd.io/bbolt"
)

// Read limits. A read returns whole batches: at least one, even when it
// alone is over the limits, so a reader always makes progress.
const (
	DefaultReadLimit = 1000    // records
	MaxReadLimit     = 10000   // records
	MaxReadBytes     = 4 << 20 // bytes of records
)

// Read returns the batches from offset on, up to limit records (0 means
// DefaultReadLimit). A stream that does not exist reads as no incarnation
// and no batches; an offset the stream never produced is ErrUnknownOffset.
// The cost is that of the records returned, whatever the offset.
func (db *DB) Read(ctx context.Context, key record.Key, offset record.Offset, limit int) (record.ReadResult, error) {
	return db.ReadBytes(ctx, key, offset, limit, MaxReadBytes)
}

// ReadBytes is Read with a smaller bound on the bytes of records than
// MaxReadBytes (0 or more means MaxReadBytes): for a reader that holds the
// page while a slow client takes it. The first batch is returned whole
// whatever its size.
func (db *DB) ReadBytes(ctx context.Context, key record.Key, offset record.Offset, limit, maxBytes int) (record.ReadResult, error) {
	return db.readBytes(ctx, key, "", nil, offset, limit, maxBytes)
}

// readBytes is ReadBytes; a Watch passes its encoded key k, validated on
// the way in, and its tail-cache entry.
func (db *DB) readBytes(ctx context.Context, key record.Key, k string, entry *tail, offset record.Offset, limit, maxBytes int) (record.ReadResult, error) {
	if maxBytes <= 0 || maxBytes > MaxReadBytes {
		maxBytes = MaxReadBytes
	}
	if err := ctx.Err(); err != nil {
		return record.ReadResult{}, err
	}
	if k == "" {
		if err := key.Validate(); err != nil {
			return record.ReadResult{}, fmt.Errorf("read %s: %w", key, err)
		}
		k = string(encodeKey(key))
	}
	pos, err := offset.Position()
	if err != nil {
		return record.ReadResult{}, fmt.Errorf("read %s: %w", key, err)
	}
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	limit = min(limit, MaxReadLimit)
	if db.isClosed() {
		return record.ReadResult{}, fmt.Errorf("read %s: %w", key, ErrClosed)
	}
	if res, ok := db.tails.read(k, entry, pos, limit, maxBytes); ok {
		return res, nil
	}
	return db.readStore(key, offset, pos, limit, maxBytes)
}

// readStore is Read from bbolt, bypassing the tail cache.
func (db *DB) readStore(key record.Key, offset record.Offset, pos uint64, limit, maxBytes int) (record.ReadResult, error) {
	res := record.ReadResult{Batches: []record.Batch{}, NextOffset: offset, UpToDate: true}
	err := db.view(func(tx *bolt.Tx) error {
		meta, ok, err := loadStream(tx, key)
		if err != nil {
			return err
		}
		if !ok {
			if pos != 0 {
				return fmt.Errorf("%w: %s (the stream does not exist)", ErrUnknownOffset, offset)
			}
			return nil
		}
		res.Incarnation = incarnationOf(meta.inc)
		if pos == meta.next {
			return nil
		}
		if pos > meta.next {
			return &OffsetError{Offset: offset, Incarnation: res.Incarnation}
		}
		c := tx.Bucket(bucketBatches).Cursor()
		k, v := c.Seek(pairKey(meta.id, pos))
		if k == nil || binary.BigEndian.Uint64(k) != meta.id || binary.BigEndian.Uint64(k[8:]) != pos {
			return &OffsetError{Offset: offset, Incarnation: res.Incarnation}
		}
		records, size := 0, 0
		next := pos
		for ; k != nil && binary.BigEndian.Uint64(k) == meta.id; k, v = c.Next() {
			count, array, err := decodeBatchHeader(v)
			if err != nil {
				return fmt.Errorf("batch at %d: %w", binary.BigEndian.Uint64(k[8:]), err)
			}
			if len(res.Batches) > 0 && (records+int(count) > limit || size+len(array) > maxBytes) {
				break
			}
			at := binary.BigEndian.Uint64(k[8:])
			// Values point into the mmap and die with the transaction.
			res.Batches = append(res.Batches, record.Batch{Offset: record.OffsetOf(at), Count: int(count), Records: bytes.Clone(array)})
			records += int(count)
			size += len(array)
			next = at + count
		}
		res.NextOffset = record.OffsetOf(next)
		res.UpToDate = next == meta.next
		res.Remaining = meta.next - next
		return nil
	})
	if err != nil {
		return record.ReadResult{}, fmt.Errorf("read %s: %w", key, err)
	}
	return res, nil
}

// OffsetError is the ErrUnknownOffset of an existing stream: it carries the
// stream's incarnation, so that a reader holding an offset of an older
// incarnation can tell it must restart from Start.
type OffsetError struct {
	Offset      record.Offset
	Incarnation record.Incarnation
}

func (e *OffsetError) Error() string {
	return fmt.Sprintf("%v: %s (incarnation %s)", ErrUnknownOffset, e.Offset, e.Incarnation)
}

func (e *OffsetError) Unwrap() error { return ErrUnknownOffset }

// Tail returns the stream's incarnation and the offset its next batch will
// have; an absent stream has no incarnation and tail Start.
func (db *DB) Tail(ctx context.Context, key record.Key) (record.Incarnation, record.Offset, error) {
	if err := ctx.Err(); err != nil {
		return "", "", err
	}
	if err := key.Validate(); err != nil {
		return "", "", fmt.Errorf("tail %s: %w", key, err)
	}
	if inc, next, ok := db.tails.tailOf(string(encodeKey(key))); ok && !db.isClosed() {
		return inc, record.OffsetOf(next), nil
	}
	var meta streamMeta
	var ok bool
	err := db.view(func(tx *bolt.Tx) (err error) {
		meta, ok, err = loadStream(tx, key)
		return err
	})
	if err != nil {
		return "", "", fmt.Errorf("tail %s: %w", key, err)
	}
	if !ok {
		return "", record.Start, nil
	}
	return incarnationOf(meta.inc), record.OffsetOf(meta.next), nil
}
