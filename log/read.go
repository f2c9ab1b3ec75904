package log

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

// Read limits. A read returns whole batches: at least one, even when it
// alone is over the limits, so a reader always makes progress.
const (
	DefaultReadLimit = 1000    // records
	MaxReadLimit     = 10000   // records
	MaxReadBytes     = 4 << 20 // bytes of records
)

// ReadResult is a page of a stream.
type ReadResult struct {
	// Incarnation is empty (JSON null) for a stream that does not exist.
	Incarnation Incarnation `json:"incarnation"`
	Batches     []Batch     `json:"batches"`
	// NextOffset is where the next read continues.
	NextOffset Offset `json:"nextOffset"`
	// UpToDate is true when the read reached the tail.
	UpToDate bool `json:"upToDate"`
	// Remaining is how many records followed NextOffset when the read was
	// made: how far behind the tail the reader still is. Servers use it to
	// notice a live reader that falls behind; it is not on the wire.
	Remaining uint64 `json:"-"`
}

// MarshalJSON writes the empty incarnation as null.
func (i Incarnation) MarshalJSON() ([]byte, error) {
	if i == "" {
		return []byte("null"), nil
	}
	return json.Marshal(string(i))
}

// UnmarshalJSON reads null as the empty incarnation.
func (i *Incarnation) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		*i = ""
		return nil
	}
	return json.Unmarshal(b, (*string)(i))
}

// Read returns the batches from offset on, up to limit records (0 means
// DefaultReadLimit). A stream that does not exist reads as no incarnation
// and no batches; an offset the stream never produced is ErrUnknownOffset.
// The cost is that of the records returned, whatever the offset.
func (db *DB) Read(ctx context.Context, key Key, offset Offset, limit int) (ReadResult, error) {
	if err := ctx.Err(); err != nil {
		return ReadResult{}, err
	}
	if err := key.Validate(); err != nil {
		return ReadResult{}, fmt.Errorf("read %s: %w", key, err)
	}
	pos, err := offset.position()
	if err != nil {
		return ReadResult{}, fmt.Errorf("read %s: %w", key, err)
	}
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	limit = min(limit, MaxReadLimit)
	if db.isClosed() {
		return ReadResult{}, fmt.Errorf("read %s: %w", key, ErrClosed)
	}
	if res, ok := db.tails.read(string(key.encode()), pos, limit); ok {
		return res, nil
	}
	return db.readStore(key, offset, pos, limit)
}

// readStore is Read from bbolt, bypassing the tail cache.
func (db *DB) readStore(key Key, offset Offset, pos uint64, limit int) (ReadResult, error) {
	res := ReadResult{Batches: []Batch{}, NextOffset: offset, UpToDate: true}
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
			if len(res.Batches) > 0 && (records+int(count) > limit || size+len(array) > MaxReadBytes) {
				break
			}
			at := binary.BigEndian.Uint64(k[8:])
			// Values point into the mmap and die with the transaction.
			res.Batches = append(res.Batches, Batch{Offset: offsetOf(at), Count: int(count), Records: bytes.Clone(array)})
			records += int(count)
			size += len(array)
			next = at + count
		}
		res.NextOffset = offsetOf(next)
		res.UpToDate = next == meta.next
		res.Remaining = meta.next - next
		return nil
	})
	if err != nil {
		return ReadResult{}, fmt.Errorf("read %s: %w", key, err)
	}
	return res, nil
}

// OffsetError is the ErrUnknownOffset of an existing stream: it carries the
// stream's incarnation, so that a reader holding an offset of an older
// incarnation can tell it must restart from Start.
type OffsetError struct {
	Offset      Offset
	Incarnation Incarnation
}

func (e *OffsetError) Error() string {
	return fmt.Sprintf("%v: %s (incarnation %s)", ErrUnknownOffset, e.Offset, e.Incarnation)
}

func (e *OffsetError) Unwrap() error { return ErrUnknownOffset }

// Tail returns the stream's incarnation and the offset its next batch will
// have; an absent stream has no incarnation and tail Start.
func (db *DB) Tail(ctx context.Context, key Key) (Incarnation, Offset, error) {
	if err := ctx.Err(); err != nil {
		return "", "", err
	}
	if err := key.Validate(); err != nil {
		return "", "", fmt.Errorf("tail %s: %w", key, err)
	}
	if inc, next, ok := db.tails.tailOf(string(key.encode())); ok && !db.isClosed() {
		return inc, offsetOf(next), nil
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
		return "", Start, nil
	}
	return incarnationOf(meta.inc), offsetOf(meta.next), nil
}

// ParseIncarnation checks the form of an incarnation from outside.
func ParseIncarnation(s string) (Incarnation, error) {
	if len(s) != len(incarnationPrefix)+ulid.EncodedSize || s[:len(incarnationPrefix)] != incarnationPrefix {
		return "", fmt.Errorf("invalid incarnation %q", truncate(s))
	}
	if _, err := ulid.ParseStrict(s[len(incarnationPrefix):]); err != nil {
		return "", fmt.Errorf("invalid incarnation %q: %w", truncate(s), err)
	}
	return Incarnation(s), nil
}
