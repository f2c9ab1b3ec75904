package log

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

// encodeBatch is the stored form: uvarint record count, then the JSON array.
func encodeBatch(recs []record.Record) ([]byte, error) { return encodeBatchPre(recs, nil) }

// encodeBatchPre is encodeBatch using pre[i], when set, for recs[i].
func encodeBatchPre(recs []record.Record, pre []*preEncoded) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(300 * len(recs))
	var n [binary.MaxVarintLen64]byte
	buf.Write(n[:binary.PutUvarint(n[:], uint64(len(recs)))])
	buf.WriteByte('[')
	for i := range recs {
		if i > 0 {
			buf.WriteByte(',')
		}
		if pre != nil && pre[i] != nil {
			buf.Write(pre[i].appendTo(buf.AvailableBuffer(), recs[i].Entry.ParentID, recs[i].Entry.Timestamp))
			continue
		}
		b, err := marshalNoHTML(recs[i])
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidRecord, err)
		}
		buf.Write(b)
	}
	buf.WriteByte(']')
	return buf.Bytes(), nil
}

// decodeBatchHeader splits a stored batch into its count and records array.
// It checks the framing only (count and brackets): the records themselves
// are served as stored, without the cost of parsing them on every read.
func decodeBatchHeader(v []byte) (count uint64, records []byte, err error) {
	count, n := binary.Uvarint(v)
	if n <= 0 || count == 0 || count > record.MaxRecordsBatch {
		return 0, nil, fmt.Errorf("stored batch: bad record count")
	}
	records = v[n:]
	if len(records) < 2 || records[0] != '[' || records[len(records)-1] != ']' {
		return 0, nil, fmt.Errorf("stored batch: records are not an array")
	}
	return count, records, nil
}

// batchPlan is an append that passed its checks and is ready to store.
type batchPlan struct {
	key     record.Key
	meta    streamMeta // as it will be after the append
	pos     uint64     // the batch's position
	value   []byte
	records []record.Record // as stored
}

// planAppend checks records against the stream and fills in what the
// engine owns: entry ids, parents (the leaf by default) and timestamps. It
// changes nothing in tx.
func planAppend(tx *bolt.Tx, key record.Key, meta streamMeta, records []record.Record, now time.Time) (*batchPlan, error) {
	return planAppendPre(tx, key, meta, records, nil, now)
}

// planAppendPre is planAppend for records that preEncode prepared: pre[i],
// when set, is records[i]'s encoding but for its parent and timestamp.
func planAppendPre(tx *bolt.Tx, key record.Key, meta streamMeta, records []record.Record, pre []*preEncoded, now time.Time) (*batchPlan, error) {
	if len(records) == 0 {
		return nil, fmt.Errorf("%w: empty batch", ErrInvalidRecord)
	}
	if len(records) > record.MaxRecordsBatch {
		return nil, fmt.Errorf("%w: %d records in one batch (at most %d)", ErrInvalidRecord, len(records), record.MaxRecordsBatch)
	}
	entries := tx.Bucket(bucketEntries)
	known := func(id string, batch map[string]bool) bool {
		return batch[id] || (meta.id != 0 && entries.Get(entryKey(meta.id, id)) != nil)
	}
	out := make([]record.Record, len(records))
	inBatch := make(map[string]bool, len(records))
	leaf := meta.leaf
	for i, r := range records {
		var p *preEncoded
		if pre != nil {
			p = pre[i]
		}
		if p == nil {
			if err := r.Validate(); err != nil {
				return nil, fmt.Errorf("record %d: %w", i, err)
			}
		}
		switch r.Kind {
		case record.KindEntry:
			e := *r.Entry
			if e.ID == "" {
				e.ID = ulid.Make().String()
			} else if (p == nil || !p.generated) && known(e.ID, inBatch) {
				return nil, fmt.Errorf("record %d: %w: %s", i, ErrDuplicateEntry, e.ID)
			}
			if e.ParentID == "" {
				e.ParentID = leaf
			} else if e.ParentID != leaf && !known(e.ParentID, inBatch) {
				return nil, fmt.Errorf("record %d: parent %s: %w", i, e.ParentID, ErrUnknownEntry)
			}
			if e.Timestamp.IsZero() {
				e.Timestamp = now
			}
			if len(e.Payload) == 0 {
				e.Payload = json.RawMessage("{}")
			}
			inBatch[e.ID] = true
			leaf = e.ID
			r.Entry = &e
		case record.KindTruncated:
			if r.RewoundTo != "" && !known(r.RewoundTo, inBatch) {
				return nil, fmt.Errorf("record %d: rewoundTo %s: %w", i, r.RewoundTo, ErrUnknownEntry)
			}
			if r.NewLeafID == "" {
				r.NewLeafID = r.RewoundTo
			} else if r.NewLeafID != r.RewoundTo && !known(r.NewLeafID, inBatch) {
				return nil, fmt.Errorf("record %d: newLeafId %s: %w", i, r.NewLeafID, ErrUnknownEntry)
			}
			leaf = r.NewLeafID
		}
		out[i] = r
	}
	value, err := encodeBatchPre(out, pre)
	if err != nil {
		return nil, err
	}
	if len(value) > record.MaxBatchBytes {
		return nil, fmt.Errorf("%w: %w: %d bytes (at most %d)", ErrInvalidRecord, ErrBatchTooLarge, len(value), record.MaxBatchBytes)
	}
	p := &batchPlan{key: key, meta: meta, pos: meta.next, value: value, records: out}
	p.meta.next += uint64(len(out))
	p.meta.leaf = leaf
	return p, nil
}

// store writes the planned batch, its entry index and the stream's meta,
// and notes the batch for the tail cache.
func (p *batchPlan) store(tx *bolt.Tx, notes *commitNotes) error {
	if err := p.meta.store(tx, p.key); err != nil {
		return err
	}
	batches := tx.Bucket(bucketBatches)
	// Each stream's batches are appended at the end of its key range.
	batches.FillPercent = 0.9
	if err := batches.Put(pairKey(p.meta.id, p.pos), p.value); err != nil {
		return err
	}
	notes.batch(p)
	entries := tx.Bucket(bucketEntries)
	pos := u64(p.pos)
	for _, r := range p.records {
		if r.Kind == record.KindEntry {
			if err := entries.Put(entryKey(p.meta.id, r.Entry.ID), pos); err != nil {
				return err
			}
		}
	}
	return nil
}
