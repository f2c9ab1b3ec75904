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

// Admission is a delivery to admit: its records (normally one user_message
// entry) are appended and its submission created in one transaction.
type Admission struct {
	Key record.Key
	// SubmissionID is generated ("sub_" and a ULID) when empty.
	SubmissionID string
	Records      []record.Record
	// IdempotencyKey, when set, makes a repeat of the same request (same
	// RequestHash) return the first admission instead of a second one.
	IdempotencyKey string
	RequestHash    string
	// RejectIfBusy refuses the admission with ErrSessionBusy when the
	// session has unsettled submissions. It is checked in the admitting
	// transaction, after the idempotency key: a retry of an admitted
	// request gets its original answer, and two racing deliveries cannot
	// both get in.
	RejectIfBusy bool
	// StartTurn, when set and the session has no other unsettled
	// submission, admits the submission already running as turn StartTurn:
	// a worker that holds the session and will run it at once saves the
	// separate commit that would record its start. Otherwise it is
	// admitted as usual. The returned Submission's Status tells which.
	StartTurn string
	// UID, when set, names the instance generation the delivery is for:
	// another than the instance's current one is a *StaleGenerationError.
	// The first delivery to an instance may name the uid it will have.
	UID string
	// MaxTurns, when positive, refuses the admission with ErrTurnLimit if
	// the session has had that many turns already (turns.go), checked in
	// the admitting transaction after the idempotency key.
	MaxTurns int
}

// MaxIdempotencyKeyLength bounds an idempotency key.
const MaxIdempotencyKeyLength = 256

type idemRecord struct {
	SubmissionID string    `json:"submissionId"`
	RequestHash  string    `json:"requestHash"`
	At           time.Time `json:"at"`
	// Change is the result of a lifecycle change (see Change), for which
	// SubmissionID is empty.
	Change json.RawMessage `json:"change,omitempty"`
	// Decision is the result of a decision on approvals (see Decide).
	Decision json.RawMessage `json:"decision,omitempty"`
}

// Admit durably admits a delivery. replayed is true when an earlier
// admission with the same idempotency key and request is returned instead.
func (db *DB) Admit(ctx context.Context, a Admission) (sub record.Submission, replayed bool, err error) {
	if err := a.Key.Validate(); err != nil {
		return record.Submission{}, false, fmt.Errorf("admit %s: %w", a.Key, err)
	}
	if len(a.IdempotencyKey) > MaxIdempotencyKeyLength || !record.Printable(a.IdempotencyKey) {
		return record.Submission{}, false, fmt.Errorf("admit %s: %w: idempotency key", a.Key, ErrInvalidRecord)
	}
	if a.SubmissionID == "" {
		a.SubmissionID = "sub_" + ulid.Make().String()
	} else if len(a.SubmissionID) > record.MaxIDLength || !record.Printable(a.SubmissionID) {
		return record.Submission{}, false, fmt.Errorf("admit %s: %w: submission id", a.Key, ErrInvalidRecord)
	}
	if len(a.StartTurn) > record.MaxIDLength || !record.Printable(a.StartTurn) {
		return record.Submission{}, false, fmt.Errorf("admit %s: %w: turn id", a.Key, ErrInvalidRecord)
	}
	// The records carry the submission id; encode them here, not in the
	// committer.
	records := make([]record.Record, len(a.Records))
	for i, r := range a.Records {
		if r.Kind == record.KindEntry && r.Entry != nil && r.Entry.SubmissionID == "" {
			e := *r.Entry
			e.SubmissionID = a.SubmissionID
			r.Entry = &e
		}
		records[i] = r
	}
	records, pre := preEncode(records)
	op := &write{prepare: func(tx *bolt.Tx, now time.Time, notes *commitNotes) (func() error, []byte, error) {
		sub, replayed = record.Submission{}, false
		return prepareAdmit(tx, a, records, pre, now, notes, db.opts.IdempotencyTTL, &sub, &replayed)
	}}
	if err := db.submit(ctx, op); err != nil {
		return record.Submission{}, false, fmt.Errorf("admit %s: %w", a.Key, err)
	}
	return sub, replayed, nil
}

func idemKey(k record.Key, key string) []byte {
	return []byte(k.Agent + "\x00" + k.Instance + "\x00" + key)
}

func prepareAdmit(tx *bolt.Tx, a Admission, records []record.Record, pre []*preEncoded, now time.Time, notes *commitNotes, ttl time.Duration, sub *record.Submission, replayed *bool) (func() error, []byte, error) {
	var ik []byte
	if a.IdempotencyKey != "" {
		ik = idemKey(a.Key, a.IdempotencyKey)
		if v := tx.Bucket(bucketIdem).Get(ik); v != nil {
			var rec idemRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return nil, nil, fmt.Errorf("idempotency record: %w", err)
			}
			if now.Sub(rec.At) < ttl {
				if rec.RequestHash != a.RequestHash || rec.SubmissionID == "" {
					return nil, nil, ErrIdempotencyKeyReused
				}
				s, err := getSubmission(tx, rec.SubmissionID)
				if err != nil {
					return nil, nil, err
				}
				*sub, *replayed = s.Submission, true
				return nil, nil, nil
			}
		}
	}
	if tx.Bucket(bucketSubmissions).Get([]byte(a.SubmissionID)) != nil {
		return nil, nil, fmt.Errorf("%w: submission %s exists", ErrDuplicateEntry, a.SubmissionID)
	}
	inst, instExisted, err := generationFor(tx, a.Key.Agent, a.Key.Instance, a.UID, now)
	if err != nil {
		return nil, nil, err
	}
	meta, exists, err := loadStream(tx, a.Key)
	if err != nil {
		return nil, nil, err
	}
	turns, counted, err := turnCount(tx, meta, exists, a.MaxTurns > 0)
	if err != nil {
		return nil, nil, err
	}
	if err := checkTurnLimit(turns, a.MaxTurns); err != nil {
		return nil, nil, err
	}
	idle := true
	if !exists {
		meta = newStream(now)
	} else if k, _ := tx.Bucket(bucketQueue).Cursor().Seek(u64(meta.id)); k != nil && binary.BigEndian.Uint64(k) == meta.id {
		if a.RejectIfBusy {
			return nil, nil, ErrSessionBusy
		}
		idle = false
	}
	plan, err := planAppendPre(tx, a.Key, meta, records, pre, now)
	if err != nil {
		return nil, nil, err
	}
	s := &storedSubmission{Submission: record.Submission{
		ID: a.SubmissionID, Key: a.Key, Offset: record.OffsetOf(plan.pos), Status: record.StatusAdmitted, AdmittedAt: now,
		UID: inst.UID,
	}}
	if a.StartTurn != "" && idle {
		s.Status, s.StartedAt, s.TurnID = record.StatusRunning, now, a.StartTurn
	}
	if first := plan.records[0]; first.Kind == record.KindEntry {
		s.EntryID = first.Entry.ID
	}
	mutate := func() error {
		if err := plan.store(tx, notes); err != nil {
			return err
		}
		if counted {
			if err := putTurnCount(tx, plan.meta.id, turns+turnsIn(plan.records)); err != nil {
				return err
			}
		}
		if err := touchInstance(tx, a.Key.Agent, a.Key.Instance, inst, instExisted, now); err != nil {
			return err
		}
		seq, err := tx.Bucket(bucketSubmissions).NextSequence()
		if err != nil {
			return err
		}
		s.Seq = seq
		if err := putSubmission(tx, s); err != nil {
			return err
		}
		if err := tx.Bucket(bucketQueue).Put(pairKey(plan.meta.id, seq), []byte(s.ID)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketOutbox).Put(u64(seq), []byte(s.ID)); err != nil {
			return err
		}
		if ik != nil {
			v, err := json.Marshal(idemRecord{SubmissionID: s.ID, RequestHash: a.RequestHash, At: now})
			if err != nil {
				return err
			}
			if err := tx.Bucket(bucketIdem).Put(ik, v); err != nil {
				return err
			}
			if err := tx.Bucket(bucketIdemExpiry).Put(append(u64(uint64(now.UnixNano())), ik...), nil); err != nil {
				return err
			}
		}
		*sub = s.Submission
		return nil
	}
	return mutate, encodeKey(a.Key), nil
}
