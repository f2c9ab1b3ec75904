package log

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/convlog/convlog/log/record"
	bolt "go.etcd.io/bbolt"
)

// Write is one atomic change to a stream: records to append and submission
// status changes, committed in one transaction so the stream and the
// submissions never disagree.
type Write struct {
	Key     record.Key
	Records []record.Record
	// Start moves these admitted submissions to running, as turn TurnID.
	Start  []string
	TurnID string
	// Settle appends one settlement entry per element, after Records, and
	// gives each submission its terminal status.
	Settle []record.Settlement
	// Incarnation, when set, makes the write fail with
	// ErrIncarnationChanged unless the stream still has it: a producer
	// that began in one incarnation never writes into the next.
	Incarnation record.Incarnation
}

// Appended says where a write's batch went.
type Appended struct {
	Incarnation record.Incarnation
	// Offset is where the batch starts; empty when the write appended no
	// records (a Start alone).
	Offset     record.Offset
	NextOffset record.Offset
	// Records are the records as stored: ids, parents, timestamps filled in.
	Records []record.Record
}

// Append stores records as one batch at the stream's tail, creating the
// stream if needed. It returns after the batch is on disk.
func (db *DB) Append(ctx context.Context, key record.Key, records ...record.Record) (Appended, error) {
	return db.Write(ctx, Write{Key: key, Records: records})
}

// Write commits w durably.
func (db *DB) Write(ctx context.Context, w Write) (Appended, error) {
	if err := w.Key.Validate(); err != nil {
		return Appended{}, fmt.Errorf("write %s: %w", w.Key, err)
	}
	if len(w.Records) == 0 && len(w.Start) == 0 && len(w.Settle) == 0 {
		return Appended{}, fmt.Errorf("write %s: %w: nothing to write", w.Key, ErrInvalidRecord)
	}
	var res Appended
	// Encoded here, not in the single committer.
	var pre []*preEncoded
	w.Records, pre = preEncode(w.Records)
	settles := preEncodeSettlements(w)
	op := &write{prepare: func(tx *bolt.Tx, now time.Time, notes *commitNotes) (func() error, []byte, error) {
		res = Appended{}
		return prepareWrite(tx, w, pre, settles, now, notes, &res)
	}}
	if err := db.submit(ctx, op); err != nil {
		return Appended{}, fmt.Errorf("write %s: %w", w.Key, err)
	}
	return res, nil
}

// settlementEntry is a settlement's entry, made and encoded before the
// write queues for the committer, for the turn the writer names. The
// transaction uses it when the submission's stored turn is that turn (as
// it is when the turn that started it settles it), and otherwise makes
// the entry itself.
type settlementEntry struct {
	turnID string
	record record.Record
	pre    *preEncoded
}

// preEncodeSettlements returns w.Settle's entries, nil where one cannot be
// made here (an invalid outcome is reported by the transaction, in order).
func preEncodeSettlements(w Write) []*settlementEntry {
	if len(w.Settle) == 0 {
		return nil
	}
	out := make([]*settlementEntry, len(w.Settle))
	for i, st := range w.Settle {
		if !st.Outcome.Valid() {
			continue
		}
		payload, err := json.Marshal(st)
		if err != nil {
			continue
		}
		recs, pre := preEncode([]record.Record{settlementRecord(st, w.TurnID, payload)})
		if pre[0] != nil {
			out[i] = &settlementEntry{turnID: w.TurnID, record: recs[0], pre: pre[0]}
		}
	}
	return out
}

func settlementRecord(st record.Settlement, turnID string, payload []byte) record.Record {
	return record.EntryRecord(record.Entry{Type: record.EntrySettlement, SubmissionID: st.SubmissionID, TurnID: turnID, Payload: payload})
}

func prepareWrite(tx *bolt.Tx, w Write, pre []*preEncoded, settles []*settlementEntry, now time.Time, notes *commitNotes, res *Appended) (func() error, []byte, error) {
	meta, exists, err := loadStream(tx, w.Key)
	if err != nil {
		return nil, nil, err
	}
	if !exists {
		if len(w.Start) > 0 || len(w.Settle) > 0 {
			return nil, nil, fmt.Errorf("%w: stream has no submissions", ErrSubmissionNotFound)
		}
		meta = newStream(now)
	}
	if w.Incarnation != "" && (!exists || incarnationOf(meta.inc) != w.Incarnation) {
		return nil, nil, fmt.Errorf("%w: expected %s", ErrIncarnationChanged, w.Incarnation)
	}
	subs := make(map[string]*storedSubmission, len(w.Start)+len(w.Settle))
	load := func(id string) (*storedSubmission, error) {
		if subs[id] != nil {
			return nil, fmt.Errorf("%w: %s named twice in one write", ErrSubmissionState, id)
		}
		s, err := getSubmission(tx, id)
		if err != nil {
			return nil, err
		}
		if s.Key != w.Key {
			return nil, fmt.Errorf("%w: %s belongs to another stream", ErrSubmissionState, id)
		}
		if s.Status.Terminal() {
			return nil, fmt.Errorf("%w: %s is %s", ErrSubmissionSettled, id, s.Status)
		}
		subs[id] = s
		return s, nil
	}
	for _, id := range w.Start {
		s, err := load(id)
		if err != nil {
			return nil, nil, err
		}
		if s.Status != record.StatusAdmitted {
			return nil, nil, fmt.Errorf("%w: %s is %s, not admitted", ErrSubmissionState, id, s.Status)
		}
		s.Status, s.StartedAt, s.TurnID = record.StatusRunning, now, w.TurnID
	}
	records := w.Records
	settled := make([]*storedSubmission, 0, len(w.Settle))
	if len(w.Settle) > 0 {
		records = append(make([]record.Record, 0, len(w.Records)+len(w.Settle)), w.Records...)
		// pre gets one element per record: the settlements' made outside
		// where they fit, nil (encoded here) where they do not.
		pre = append(pre[:len(pre):len(pre)], make([]*preEncoded, len(w.Settle))...)
		for i, st := range w.Settle {
			if !st.Outcome.Valid() {
				return nil, nil, fmt.Errorf("%w: outcome %q", ErrInvalidRecord, st.Outcome)
			}
			s := subs[st.SubmissionID]
			if s == nil {
				if s, err = load(st.SubmissionID); err != nil {
					return nil, nil, err
				}
			}
			s.Status, s.SettledAt = record.Status(st.Outcome), now
			s.Error, s.AnsweredBySubmissionID = st.Error, st.AnsweredBySubmissionID
			if s.TurnID == "" {
				s.TurnID = w.TurnID
			}
			settled = append(settled, s)
			if e := settles[i]; e != nil && e.turnID == s.TurnID {
				pre[len(records)] = e.pre
				records = append(records, e.record)
				continue
			}
			payload, err := json.Marshal(st)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: settlement: %v", ErrInvalidRecord, err)
			}
			records = append(records, settlementRecord(st, s.TurnID, payload))
		}
	}
	var plan *batchPlan
	if len(records) > 0 {
		if plan, err = planAppendPre(tx, w.Key, meta, records, pre, now); err != nil {
			return nil, nil, err
		}
	}
	mutate := func() error {
		if plan != nil {
			if err := plan.store(tx, notes); err != nil {
				return err
			}
			meta = plan.meta
			res.Offset, res.Records = record.OffsetOf(plan.pos), plan.records
			if turnsIn(plan.records) > 0 {
				// User messages outside an admission: recounted when
				// next needed.
				if err := forgetTurnCount(tx, meta.id); err != nil {
					return err
				}
			}
		}
		res.Incarnation, res.NextOffset = incarnationOf(meta.inc), record.OffsetOf(meta.next)
		for _, s := range subs {
			if err := putSubmission(tx, s); err != nil {
				return err
			}
		}
		queue := tx.Bucket(bucketQueue)
		for _, s := range settled {
			if err := queue.Delete(pairKey(meta.id, s.Seq)); err != nil {
				return err
			}
		}
		return nil
	}
	var touched []byte
	if plan != nil {
		touched = encodeKey(w.Key)
	}
	return mutate, touched, nil
}
