package log

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/convlog/convlog/log/record"
	bolt "go.etcd.io/bbolt"
)

// Decide is a body of decisions on a waiting submission's approval
// requests.
type Decide struct {
	// Key names the agent and instance of the route; a submission of
	// another is not found. Its Session is ignored (the submission's is
	// used).
	Key          record.Key
	SubmissionID string
	// Decisions are applied all or none. They may be nil when Malformed
	// is set.
	Decisions []record.ApprovalDecisionPayload
	// IDs are approval ids a lenient parse of a malformed body found, so
	// that an unknown one is reported before the malformation, in the
	// documented order.
	IDs []string
	// Malformed is why the body failed strict decoding. It is returned
	// (wrapping ErrInvalidRecord unless it is already one) only after
	// the state checks pass, and nothing is written.
	Malformed error
	// IdempotencyKey and RequestHash make a repeat of the same request
	// return the first result, as for Admit.
	IdempotencyKey string
	RequestHash    string
}

// Decided is what a decision did. It is also what an idempotent repeat
// returns, stored with the key.
type Decided struct {
	// Submission is the submission after the decisions (without its
	// Approvals, which stay internal; Pending shows what is left).
	Submission record.Submission `json:"submission"`
	// Offset and NextOffset locate the batch of approval_decision
	// entries: reading from Offset returns the first decision first.
	Incarnation record.Incarnation `json:"incarnation"`
	Offset      record.Offset      `json:"offset"`
	NextOffset  record.Offset      `json:"nextOffset"`
	// Resumed: nothing is left undecided, and the submission is back in
	// the outbox for a turn to resume it.
	Resumed bool `json:"resumed"`
}

// Decide durably applies decisions to a waiting submission's approval
// requests, in one transaction of the single committer, so a racing
// decision, a timeout, an abort or a reset is either before or after it.
// The checks come in this order: an idempotent repeat (replayed);
// ErrSubmissionNotFound for an unknown submission or one of another agent
// or instance; ErrNotWaiting for one that is not input_required with
// requests undecided (whatever the ids); ErrUnknownApproval; then
// ErrAlreadyDecided; then d.Malformed or an invalid decision
// (ErrInvalidRecord). On an error nothing is written. Otherwise one batch
// of approval_decision entries is appended to the submission's stream, in
// request order, and when no request is left undecided the submission goes
// back to the outbox (Resumed): a Write.Start takes it to running again.
func (db *DB) Decide(ctx context.Context, d Decide) (res Decided, replayed bool, err error) {
	if len(d.IdempotencyKey) > MaxIdempotencyKeyLength || !record.Printable(d.IdempotencyKey) {
		return Decided{}, false, fmt.Errorf("decide %s: %w: idempotency key", record.Clip(d.SubmissionID, 40), ErrInvalidRecord)
	}
	invalid := checkDecisions(d)
	op := &write{prepare: func(tx *bolt.Tx, now time.Time, notes *commitNotes) (func() error, []byte, error) {
		res, replayed = Decided{}, false
		return prepareDecide(tx, d, invalid, now, notes, db.opts.IdempotencyTTL, &res, &replayed)
	}}
	if err := db.submit(ctx, op); err != nil {
		return Decided{}, false, fmt.Errorf("decide %s: %w", record.Clip(d.SubmissionID, 40), err)
	}
	return res, replayed, nil
}

// checkDecisions is what is wrong with d's body, if anything: reported by
// the transaction after the state checks.
func checkDecisions(d Decide) error {
	if d.Malformed != nil {
		if errors.Is(d.Malformed, ErrInvalidRecord) {
			return d.Malformed
		}
		return fmt.Errorf("%w: %w", ErrInvalidRecord, d.Malformed)
	}
	if len(d.Decisions) == 0 {
		return fmt.Errorf("%w: no decisions", ErrInvalidRecord)
	}
	seen := make(map[string]bool, len(d.Decisions))
	for _, x := range d.Decisions {
		id := record.Clip(x.ApprovalID, 40)
		switch {
		case seen[x.ApprovalID]:
			return fmt.Errorf("%w: approval %s decided twice in one request", ErrInvalidRecord, id)
		case len(x.Reason) > record.MaxReasonLength:
			return fmt.Errorf("%w: approval %s: reason too long", ErrInvalidRecord, id)
		case len(x.Input) > 0 && !x.Approved:
			return fmt.Errorf("%w: approval %s: edited input with a denial", ErrInvalidRecord, id)
		case len(x.Input) > 0 && !json.Valid(x.Input):
			return fmt.Errorf("%w: approval %s: input is not JSON", ErrInvalidRecord, id)
		case x.Principal != nil && (len(x.Principal.Subject) > record.MaxIDLength*4 || len(x.Principal.Issuer) > record.MaxIDLength*4):
			return fmt.Errorf("%w: approval %s: principal too long", ErrInvalidRecord, id)
		}
		seen[x.ApprovalID] = true
	}
	return nil
}

func prepareDecide(tx *bolt.Tx, d Decide, invalid error, now time.Time, notes *commitNotes, ttl time.Duration, res *Decided, replayed *bool) (func() error, []byte, error) {
	// 1. An idempotent repeat gets its first answer, even though the
	// submission no longer waits.
	var ik []byte
	if d.IdempotencyKey != "" {
		ik = idemKey(d.Key, d.IdempotencyKey)
		if v := tx.Bucket(bucketIdem).Get(ik); v != nil {
			var rec idemRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return nil, nil, fmt.Errorf("idempotency record: %w", err)
			}
			if now.Sub(rec.At) < ttl {
				if rec.RequestHash != d.RequestHash || len(rec.Decision) == 0 {
					return nil, nil, ErrIdempotencyKeyReused
				}
				if err := json.Unmarshal(rec.Decision, res); err != nil {
					return nil, nil, fmt.Errorf("idempotency record: %w", err)
				}
				*replayed = true
				return nil, nil, nil
			}
		}
	}
	// 2. The submission, of the route's agent and instance.
	s, err := getSubmission(tx, d.SubmissionID)
	if err != nil {
		return nil, nil, err
	}
	if s.Key.Agent != d.Key.Agent || s.Key.Instance != d.Key.Instance {
		return nil, nil, fmt.Errorf("%w: %s", ErrSubmissionNotFound, record.Clip(d.SubmissionID, 40))
	}
	// 3. Waiting, with something left to decide.
	if !s.Waiting() {
		return nil, nil, fmt.Errorf("%w: %s is %s", ErrNotWaiting, s.ID, s.Status)
	}
	index := make(map[string]int, len(s.Approvals))
	for i, a := range s.Approvals {
		index[a.ApprovalID] = i
	}
	// 4. Every id named is one of its requests.
	ids := make([]string, 0, len(d.IDs)+len(d.Decisions))
	ids = append(ids, d.IDs...)
	for _, x := range d.Decisions {
		ids = append(ids, x.ApprovalID)
	}
	for _, id := range ids {
		if _, ok := index[id]; !ok {
			return nil, nil, fmt.Errorf("%w: %s of %s", ErrUnknownApproval, record.Clip(id, 40), s.ID)
		}
	}
	// 5. None decided before: the first decision stands.
	for _, id := range ids {
		if s.Approvals[index[id]].Decided {
			return nil, nil, fmt.Errorf("%w: %s of %s", ErrAlreadyDecided, record.Clip(id, 40), s.ID)
		}
	}
	// 6. A well-formed body.
	if invalid != nil {
		return nil, nil, invalid
	}
	byID := make(map[string]record.ApprovalDecisionPayload, len(d.Decisions))
	for _, x := range d.Decisions {
		byID[x.ApprovalID] = x
	}
	var records []record.Record
	for i := range s.Approvals {
		a := &s.Approvals[i]
		x, ok := byID[a.ApprovalID]
		if !ok {
			continue
		}
		payload, err := json.Marshal(x)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: decision: %v", ErrInvalidRecord, err)
		}
		records = append(records, record.EntryRecord(record.Entry{Type: record.EntryApprovalDecision, SubmissionID: s.ID, Payload: payload}))
		a.Decided, a.Approved, a.Reason, a.DecidedAt = true, x.Approved, x.Reason, now
		a.EditedInput = nil
		if x.Approved && len(x.Input) > 0 {
			a.EditedInput = append(json.RawMessage(nil), x.Input...)
		}
	}
	s.derivePending()
	meta, ok, err := loadStream(tx, s.Key)
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s has no stream", ErrNotWaiting, s.ID)
	}
	plan, err := planAppend(tx, s.Key, meta, records, now)
	if err != nil {
		return nil, nil, err
	}
	resumed := len(s.Pending) == 0
	mutate := func() error {
		if err := plan.store(tx, notes); err != nil {
			return err
		}
		if err := putSubmission(tx, s); err != nil {
			return err
		}
		if resumed {
			// Runnable again: the relay offers it to the workers as it
			// does an admission.
			if err := tx.Bucket(bucketOutbox).Put(u64(s.Seq), []byte(s.ID)); err != nil {
				return err
			}
		}
		*res = Decided{Submission: s.Submission, Incarnation: incarnationOf(plan.meta.inc),
			Offset: record.OffsetOf(plan.pos), NextOffset: record.OffsetOf(plan.meta.next), Resumed: resumed}
		if ik == nil {
			return nil
		}
		out, err := json.Marshal(res)
		if err != nil {
			return err
		}
		v, err := json.Marshal(idemRecord{RequestHash: d.RequestHash, At: now, Decision: out})
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketIdem).Put(ik, v); err != nil {
			return err
		}
		return tx.Bucket(bucketIdemExpiry).Put(append(u64(uint64(now.UnixNano())), ik...), nil)
	}
	return mutate, encodeKey(s.Key), nil
}
