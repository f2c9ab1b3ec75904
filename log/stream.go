package log

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

// streamMeta is a stream's row in the streams bucket.
type streamMeta struct {
	id      uint64    // internal, prefixes the stream's batch and entry keys
	next    uint64    // position of the next batch: records stored so far
	inc     ulid.ULID // incarnation
	created int64     // unix nanoseconds
	leaf    string    // last entry of the active path
}

const streamMetaFixed = 8 + 8 + 16 + 8

func (m *streamMeta) encode() []byte {
	b := make([]byte, streamMetaFixed+len(m.leaf))
	binary.BigEndian.PutUint64(b[0:], m.id)
	binary.BigEndian.PutUint64(b[8:], m.next)
	copy(b[16:32], m.inc[:])
	binary.BigEndian.PutUint64(b[32:], uint64(m.created))
	copy(b[streamMetaFixed:], m.leaf)
	return b
}

func decodeStreamMeta(b []byte) (streamMeta, error) {
	if len(b) < streamMetaFixed {
		return streamMeta{}, fmt.Errorf("stream meta: %d bytes", len(b))
	}
	var m streamMeta
	m.id = binary.BigEndian.Uint64(b[0:])
	m.next = binary.BigEndian.Uint64(b[8:])
	copy(m.inc[:], b[16:32])
	m.created = int64(binary.BigEndian.Uint64(b[32:]))
	m.leaf = string(b[streamMetaFixed:])
	return m, nil
}

// loadStream reads a stream's meta; ok is false when it does not exist.
func loadStream(tx *bolt.Tx, key record.Key) (m streamMeta, ok bool, err error) {
	v := tx.Bucket(bucketStreams).Get(encodeKey(key))
	if v == nil {
		return streamMeta{}, false, nil
	}
	m, err = decodeStreamMeta(v)
	if err != nil {
		return streamMeta{}, false, fmt.Errorf("%s: %w", key, err)
	}
	return m, true, nil
}

// newStream makes the meta of a stream that does not exist yet; its id is
// allocated when it is first stored.
func newStream(now time.Time) streamMeta {
	return streamMeta{inc: ulid.Make(), created: now.UnixNano()}
}

func (m *streamMeta) store(tx *bolt.Tx, key record.Key) error {
	streams := tx.Bucket(bucketStreams)
	if m.id == 0 {
		id, err := streams.NextSequence()
		if err != nil {
			return err
		}
		m.id = id
	}
	return streams.Put(encodeKey(key), m.encode())
}

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func pairKey(a, b uint64) []byte {
	k := make([]byte, 16)
	binary.BigEndian.PutUint64(k, a)
	binary.BigEndian.PutUint64(k[8:], b)
	return k
}

// entryKey puts the entry id first: generated ids are ULIDs, ordered by
// time, so the index of a commit's new entries lands on one or two pages at
// the end of the bucket instead of one page per stream. The id's length
// tells apart the keys of ids that are prefixes of each other.
func entryKey(streamID uint64, entryID string) []byte {
	k := make([]byte, len(entryID)+8)
	copy(k, entryID)
	binary.BigEndian.PutUint64(k[len(entryID):], streamID)
	return k
}
