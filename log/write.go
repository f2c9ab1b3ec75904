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
	// Start moves these admitted (or resumable: every approval decided)
	// submissions to running, as turn TurnID.
	Start  []string
	TurnID string
	// Settle appends one settlement entry per element, after Records, and
	// gives each submission its terminal status.
	Settle []record.Settlement
	// Incarnation, when set, makes the write fail with
	// ErrIncarnationChanged unless the stream still has it: a producer
	// that began in one incarnation never writes into the next.
	Incarnation record.Incarnation
	// Await, when set, ends turn TurnID of a running submission without
	// settling it: after Records, one approval_request entry lists the
	// requests, and the submission becomes input_required until they are
	// decided (DB.Decide). It stays unsettled, so the session stays busy.
	Await *Await
}

// Await is a turn's stop to ask a person to approve tool calls.
type Await struct {
	SubmissionID string
	// Requests are at least one, with unique ApprovalIDs and ToolCallIDs.
	Requests []record.ApprovalRequest
	// Timeout, when positive, sets the submission's ApprovalDeadline to
	// the commit time plus Timeout.
	Timeout time.Duration
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
	if len(w.Records) == 0 && len(w.Start) == 0 && len(w.Settle) == 0 && w.Await == nil {
		return Appended{}, fmt.Errorf("write %s: %w: nothing to write", w.Key, ErrInvalidRecord)
	}
	var awaitRec record.Record
	if w.Await != nil {
		var err error
		if awaitRec, err = awaitRecord(w); err != nil {
			return Appended{}, fmt.Errorf("write %s: %w", w.Key, err)
		}
	}
	var res Appended
	// Encoded here, not in the single committer.
	var pre []*preEncoded
	w.Records, pre = preEncode(w.Records)
	settles := preEncodeSettlements(w)
	op := &write{prepare: func(tx *bolt.Tx, now time.Time, notes *commitNotes) (func() error, []byte, error) {
		res = Appended{}
		return prepareWrite(tx, w, pre, settles, awaitRec, now, notes, &res)
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

// awaitRecord checks w.Await and makes its approval_request entry.
func awaitRecord(w Write) (record.Record, error) {
	a := w.Await
	if a.SubmissionID == "" || w.TurnID == "" {
		return record.Record{}, fmt.Errorf("%w: await needs a submission and its turn", ErrInvalidRecord)
	}
	if len(a.Requests) == 0 {
		return record.Record{}, fmt.Errorf("%w: await without requests", ErrInvalidRecord)
	}
	if a.Timeout < 0 {
		return record.Record{}, fmt.Errorf("%w: negative approval timeout", ErrInvalidRecord)
	}
	ids, calls := map[string]bool{}, map[string]bool{}
	for _, r := range a.Requests {
		if r.ApprovalID == "" || len(r.ApprovalID) > record.MaxIDLength || !record.Printable(r.ApprovalID) ||
			r.ToolCallID == "" || len(r.ToolCallID) > record.MaxIDLength || !record.Printable(r.ToolCallID) {
			return record.Record{}, fmt.Errorf("%w: approval request ids", ErrInvalidRecord)
		}
		if ids[r.ApprovalID] || calls[r.ToolCallID] {
			return record.Record{}, fmt.Errorf("%w: approval request %s named twice", ErrInvalidRecord, record.Clip(r.ApprovalID, 40))
		}
		if len(r.Input) > 0 && !json.Valid(r.Input) {
			return record.Record{}, fmt.Errorf("%w: approval request %s: input is not JSON", ErrInvalidRecord, record.Clip(r.ApprovalID, 40))
		}
		ids[r.ApprovalID], calls[r.ToolCallID] = true, true
	}
	payload, err := json.Marshal(record.ApprovalRequestPayload{Requests: a.Requests})
	if err != nil {
		return record.Record{}, fmt.Errorf("%w: approval request: %v", ErrInvalidRecord, err)
	}
	return record.EntryRecord(record.Entry{Type: record.EntryApprovalRequest, SubmissionID: a.SubmissionID, TurnID: w.TurnID, Payload: payload}), nil
}

func prepareWrite(tx *bolt.Tx, w Write, pre []*preEncoded, settles []*settlementEntry, awaitRec record.Record, now time.Time, notes *commitNotes, res *Appended) (func() error, []byte, error) {
	meta, exists, err := loadStream(tx, w.Key)
	if err != nil {
		return nil, nil, err
	}
	if !exists {
		if len(w.Start) > 0 || len(w.Settle) > 0 || w.Await != nil {
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
		switch {
		case s.Status == record.StatusAdmitted:
			s.Status, s.StartedAt, s.TurnID = record.StatusRunning, now, w.TurnID
		case s.Resumable():
			// A new turn of the same submission: it started when it first
			// ran.
			s.Status, s.TurnID = record.StatusRunning, w.TurnID
		default:
			return nil, nil, fmt.Errorf("%w: %s is %s, not admitted or resumable", ErrSubmissionState, id, s.Status)
		}
	}
	records := w.Records
	if w.Await != nil {
		s, err := load(w.Await.SubmissionID)
		if err != nil {
			return nil, nil, err
		}
		if s.Status != record.StatusRunning || s.TurnID != w.TurnID {
			return nil, nil, fmt.Errorf("%w: %s is %s (turn %s), not running as turn %s", ErrSubmissionState,
				s.ID, s.Status, record.Clip(s.TurnID, 40), record.Clip(w.TurnID, 40))
		}
		s.Status, s.WaitingSince = record.StatusInputRequired, now
		s.Approvals = make([]record.Approval, len(w.Await.Requests))
		for i, r := range w.Await.Requests {
			s.Approvals[i] = record.Approval{ApprovalRequest: r}
		}
		s.ApprovalDeadline = time.Time{}
		if w.Await.Timeout > 0 {
			s.ApprovalDeadline = now.Add(w.Await.Timeout)
		}
		s.derivePending()
		// The request comes after the records (the rest of the asking
		// message) and before any settlement of other submissions.
		records = append(append(make([]record.Record, 0, len(w.Records)+1+len(w.Settle)), w.Records...), awaitRec)
		pre = append(pre[:len(pre):len(pre)], nil)
	}
	settled := make([]*storedSubmission, 0, len(w.Settle))
	if len(w.Settle) > 0 {
		records = append(make([]record.Record, 0, len(records)+len(w.Settle)), records...)
		// pre gets one element per record: the settlements' made outside
		// where they fit, nil (encoded here) where they do not.
		pre = append(pre[:len(pre):len(pre)], make([]*preEncoded, len(w.Settle))...)
		for i, st := range w.Settle {
			if !st.Outcome.Valid() {
				return nil, nil, fmt.Errorf("%w: outcome %q", ErrInvalidRecord, st.Outcome)
			}
			if w.Await != nil && st.SubmissionID == w.Await.SubmissionID {
				return nil, nil, fmt.Errorf("%w: %s both awaits and settles", ErrSubmissionState, st.SubmissionID)
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
