package log

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/convlog/convlog/log/record"
)

// ChangeKind names a lifecycle change of a conversation.
type ChangeKind string

// Lifecycle changes. Each is one transaction, and each leaves a record in
// the stream it changes (a truncation, a new incarnation, a fork's first
// entry) or, for a delete, removes the streams so that every reader sees
// the conversation end.
const (
	// ChangeRewind returns the active path to just before a user message.
	ChangeRewind ChangeKind = "rewind"
	// ChangeRegenerate rewinds to before a user message and admits the
	// same message again as a new submission.
	ChangeRegenerate ChangeKind = "regenerate"
	// ChangeFork copies the active path up to an entry into a new stream.
	ChangeFork ChangeKind = "fork"
	// ChangeReset gives the stream a new incarnation (see Reset).
	ChangeReset ChangeKind = "reset"
	// ChangeDelete ends an instance: every session, the generation uid.
	ChangeDelete ChangeKind = "delete"
)

// EntryForked is the type of a fork's first entry: where it came from.
const EntryForked = "forked"

// ForkedPayload is the payload of an EntryForked entry.
type ForkedPayload struct {
	Agent       string             `json:"agent"`
	Instance    string             `json:"instance"`
	Session     string             `json:"session"`
	Incarnation record.Incarnation `json:"incarnation"`
	EntryID     string             `json:"entryId"`
}

// Truncation reasons of the lifecycle changes.
const (
	ReasonRewind     = "rewind"
	ReasonRegenerate = "regenerate"
)

// Change is a lifecycle change to commit with Change.
type Change struct {
	Kind ChangeKind
	// Key is the session changed; a delete uses its agent and instance.
	Key record.Key
	// EntryID is the user message a rewind or regenerate goes back to
	// before ("" for regenerate: the last one on the path), or the last
	// entry a fork copies.
	EntryID string
	// Target is a fork's new conversation.
	Target record.Key
	// Purge makes a delete remove the records and submissions too.
	Purge bool
	// Metadata are keys a regenerate sets in the copied message's
	// metadata (the server records who delivered it again).
	Metadata map[string]json.RawMessage
	// IdempotencyKey and RequestHash make a repeat of the same request
	// return the first result, as for Admit.
	IdempotencyKey string
	RequestHash    string
	// MaxTurns limits a regenerate as Admission.MaxTurns limits a
	// delivery: the message admitted again is a turn.
	MaxTurns int
}

// ChangeResult is what a change did. It is also what an idempotent repeat
// returns, stored with the key.
type ChangeResult struct {
	Kind ChangeKind `json:"kind"`
	// Incarnation, Offset and NextOffset locate the change's batch in the
	// changed (or, for a fork, the new) stream: reading from Offset shows
	// it. A reset's Offset is Start.
	Incarnation record.Incarnation `json:"incarnation,omitempty"`
	Offset      record.Offset      `json:"offset,omitempty"`
	NextOffset  record.Offset      `json:"nextOffset,omitempty"`
	// LeafID is the active path's leaf after a rewind or regenerate's
	// truncation ("" for the very start).
	LeafID string `json:"leafId"`
	// Submission is a regenerate's new submission.
	Submission *record.Submission `json:"submission,omitempty"`
	// Aborted are the submissions the change settled aborted.
	Aborted []string `json:"aborted"`
	// UID is the instance generation (a fork's target's; a delete's
	// ended one).
	UID string `json:"uid,omitempty"`
	// TargetInstance and TargetSession name a fork's new conversation.
	TargetInstance string `json:"targetInstance,omitempty"`
	TargetSession  string `json:"targetSession,omitempty"`
	// PreviousIncarnation and PreviousTail are what a reset ended: the
	// incarnation and the tail of the records it removed.
	PreviousIncarnation record.Incarnation `json:"previousIncarnation,omitempty"`
	PreviousTail        record.Offset      `json:"previousTail,omitempty"`
	// Sessions are the sessions a delete ended.
	Sessions []string `json:"sessions,omitempty"`
	Purged   bool     `json:"purged,omitempty"`
}

// Change commits a lifecycle change. replayed is true when an earlier
// change with the same idempotency key and request is returned instead.
// Unsettled submissions of the changed streams (but for a fork's source)
// are settled aborted in the same transaction, before the change's own
// records: no submission is left waiting on a path that no longer leads to
// it.
func (db *DB) Change(ctx context.Context, c Change) (res ChangeResult, replayed bool, err error) {
	if err := c.Key.Validate(); err != nil {
		return ChangeResult{}, false, fmt.Errorf("%s %s: %w", c.Kind, c.Key, err)
	}
	if len(c.IdempotencyKey) > MaxIdempotencyKeyLength || !record.Printable(c.IdempotencyKey) {
		return ChangeResult{}, false, fmt.Errorf("%s %s: %w: idempotency key", c.Kind, c.Key, ErrInvalidRecord)
	}
	if len(c.EntryID) > record.MaxIDLength || !record.Printable(c.EntryID) {
		return ChangeResult{}, false, fmt.Errorf("%s %s: %w: entry id", c.Kind, c.Key, ErrUnknownEntry)
	}
	if c.Kind == ChangeFork {
		if err := c.Target.Validate(); err != nil {
			return ChangeResult{}, false, fmt.Errorf("fork %s: target: %w", c.Key, err)
		}
	}
	var idx *pathIndex
	if c.Kind == ChangeRewind || c.Kind == ChangeRegenerate || c.Kind == ChangeFork {
		var err error
		if idx, err = db.indexOf(c.Key); err != nil {
			return ChangeResult{}, false, fmt.Errorf("%s %s: %w", c.Kind, c.Key, err)
		}
	}
	op := &write{prepare: func(tx *bolt.Tx, now time.Time, notes *commitNotes) (func() error, []byte, error) {
		res, replayed = ChangeResult{}, false
		var ik []byte
		if c.IdempotencyKey != "" {
			ik = idemKey(c.Key, c.IdempotencyKey)
			if v := tx.Bucket(bucketIdem).Get(ik); v != nil {
				var rec idemRecord
				if err := json.Unmarshal(v, &rec); err != nil {
					return nil, nil, fmt.Errorf("idempotency record: %w", err)
				}
				if now.Sub(rec.At) < db.opts.IdempotencyTTL {
					if rec.RequestHash != c.RequestHash || len(rec.Change) == 0 {
						return nil, nil, ErrIdempotencyKeyReused
					}
					if err := json.Unmarshal(rec.Change, &res); err != nil {
						return nil, nil, fmt.Errorf("idempotency record: %w", err)
					}
					replayed = true
					return nil, nil, nil
				}
			}
		}
		var mutate func() error
		var touched []byte
		var err error
		switch c.Kind {
		case ChangeRewind, ChangeRegenerate:
			mutate, err = prepareRewind(tx, c, idx, now, notes, &res)
			touched = encodeKey(c.Key)
		case ChangeFork:
			mutate, err = prepareFork(tx, c, idx, now, notes, &res)
			touched = encodeKey(c.Target)
		case ChangeReset:
			mutate, err = prepareReset(tx, c, now, notes, &res)
			touched = encodeKey(c.Key)
		case ChangeDelete:
			mutate, err = prepareDelete(tx, c, now, notes, &res)
		default:
			err = fmt.Errorf("%w: change kind %q", ErrInvalidRecord, c.Kind)
		}
		if err != nil {
			return nil, nil, err
		}
		return func() error {
			if err := mutate(); err != nil {
				return err
			}
			res.Kind = c.Kind
			if res.Aborted == nil {
				res.Aborted = []string{}
			}
			if ik == nil {
				return nil
			}
			out, err := json.Marshal(res)
			if err != nil {
				return err
			}
			v, err := json.Marshal(idemRecord{RequestHash: c.RequestHash, At: now, Change: out})
			if err != nil {
				return err
			}
			if err := tx.Bucket(bucketIdem).Put(ik, v); err != nil {
				return err
			}
			return tx.Bucket(bucketIdemExpiry).Put(append(u64(uint64(now.UnixNano())), ik...), nil)
		}, touched, nil
	}}
	if err := db.submit(ctx, op); err != nil {
		return ChangeResult{}, false, fmt.Errorf("%s %s: %w", c.Kind, c.Key, err)
	}
	return res, replayed, nil
}

// pathEntry is an entry of a stream with the position of its batch.
type pathEntry struct {
	record.Entry
	pos uint64
}

// pathIndex is a stream's entries as a read made before the commit saw
// them: finding the active path costs a read of the whole stream, which
// must not stall the single writer. In the commit only the batches written
// since are read.
type pathIndex struct {
	id   uint64
	inc  ulid.ULID
	next uint64
	byID map[string]pathEntry
}

// indexEntries adds the entries of the stream's batches from position from
// on to byID.
func indexEntries(tx *bolt.Tx, streamID, from uint64, byID map[string]pathEntry) error {
	c := tx.Bucket(bucketBatches).Cursor()
	for k, v := c.Seek(pairKey(streamID, from)); k != nil && binary.BigEndian.Uint64(k) == streamID; k, v = c.Next() {
		_, array, err := decodeBatchHeader(v)
		if err != nil {
			return err
		}
		recs, err := record.RawRecords(array).Decode()
		if err != nil {
			return err
		}
		pos := binary.BigEndian.Uint64(k[8:])
		for _, r := range recs {
			if r.Kind == record.KindEntry && r.Entry != nil {
				byID[r.Entry.ID] = pathEntry{Entry: *r.Entry, pos: pos}
			}
		}
	}
	return nil
}

// indexOf reads key's stream in a read transaction; nil when it does not
// exist (the commit then finds out for itself).
func (db *DB) indexOf(key record.Key) (*pathIndex, error) {
	var idx *pathIndex
	err := db.view(func(tx *bolt.Tx) error {
		meta, ok, err := loadStream(tx, key)
		if err != nil || !ok {
			return err
		}
		idx = &pathIndex{id: meta.id, inc: meta.inc, next: meta.next, byID: map[string]pathEntry{}}
		return indexEntries(tx, meta.id, 0, idx.byID)
	})
	return idx, err
}

// activePath returns the chain of ancestors of the stream's leaf, root
// first, from idx and what was committed after it (or, when idx is of
// another incarnation, from a read of the whole stream).
func activePath(tx *bolt.Tx, meta streamMeta, idx *pathIndex) ([]pathEntry, error) {
	base, since := map[string]pathEntry{}, map[string]pathEntry{}
	switch {
	case idx != nil && idx.id == meta.id && idx.inc == meta.inc && idx.next <= meta.next:
		base = idx.byID
		if err := indexEntries(tx, meta.id, idx.next, since); err != nil {
			return nil, err
		}
	default:
		if err := indexEntries(tx, meta.id, 0, since); err != nil {
			return nil, err
		}
	}
	var path []pathEntry
	for id := meta.leaf; id != "" && len(path) <= len(base)+len(since); {
		e, ok := since[id]
		if !ok {
			if e, ok = base[id]; !ok {
				break
			}
		}
		path = append(path, e)
		id = e.ParentID
	}
	for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
		path[i], path[j] = path[j], path[i]
	}
	return path, nil
}

// findOnPath locates entryID: ErrUnknownEntry when the stream never had
// it, ErrNotOnPath when it is not on the active path (or, with userOnly,
// not a user message).
func findOnPath(tx *bolt.Tx, meta streamMeta, path []pathEntry, entryID string, userOnly bool) (int, error) {
	for i, e := range path {
		if e.ID == entryID {
			if userOnly && e.Type != record.EntryUserMessage {
				return 0, fmt.Errorf("%w: %s is a %s, not a user message", ErrNotOnPath, record.Clip(entryID, 40), e.Type)
			}
			return i, nil
		}
	}
	if tx.Bucket(bucketEntries).Get(entryKey(meta.id, entryID)) == nil {
		return 0, fmt.Errorf("%w: %s", ErrUnknownEntry, record.Clip(entryID, 40))
	}
	return 0, fmt.Errorf("%w: %s", ErrNotOnPath, record.Clip(entryID, 40))
}

func failureOf(kind ChangeKind) *record.Failure {
	switch kind {
	case ChangeRewind:
		return &record.Failure{Code: "rewound", Message: "the conversation was rewound before the submission settled"}
	case ChangeRegenerate:
		return &record.Failure{Code: "regenerated", Message: "the conversation was regenerated before the submission settled"}
	case ChangeDelete:
		return &record.Failure{Code: "deleted", Message: "the instance was deleted before the submission settled"}
	default:
		return &record.Failure{Code: "stream_reset", Message: "the stream was reset before the submission settled"}
	}
}

// abortUnsettled settles the stream's unsettled submissions aborted and
// returns their settlement entries, for the caller to append.
func abortUnsettled(tx *bolt.Tx, streamID uint64, now time.Time, f *record.Failure) ([]record.Record, []string, error) {
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
			return nil, nil, err
		}
		fc := *f
		s.Status, s.SettledAt, s.Error = record.StatusAborted, now, &fc
		if err := putSubmission(tx, s); err != nil {
			return nil, nil, err
		}
		if err := tx.Bucket(bucketOutbox).Delete(u64(s.Seq)); err != nil {
			return nil, nil, err
		}
		payload, err := json.Marshal(record.Settlement{SubmissionID: id, Outcome: record.OutcomeAborted, Error: &fc})
		if err != nil {
			return nil, nil, err
		}
		settled = append(settled, record.EntryRecord(record.Entry{Type: record.EntrySettlement, SubmissionID: id, TurnID: s.TurnID, Payload: payload}))
	}
	if ids == nil {
		ids = []string{}
	}
	return settled, ids, deletePrefix(queue, u64(streamID))
}

// appendChunked stores recs at the stream's tail in as many batches as
// MaxRecordsBatch requires, in order, and returns the last batch's plan: a
// change that settles every unsettled submission of a session (over 1,024
// of them, behind a slow agent) is not refused for the size of its
// settlements. The last batch holds the change's own records, which come
// last in recs.
func appendChunked(tx *bolt.Tx, key record.Key, meta streamMeta, recs []record.Record, now time.Time, notes *commitNotes) (*batchPlan, error) {
	for {
		n := min(len(recs), record.MaxRecordsBatch)
		plan, err := planAppend(tx, key, meta, recs[:n], now)
		if err != nil {
			return nil, err
		}
		if err := plan.store(tx, notes); err != nil {
			return nil, err
		}
		if recs = recs[n:]; len(recs) == 0 {
			return plan, nil
		}
		meta = plan.meta
	}
}

func prepareRewind(tx *bolt.Tx, c Change, idx *pathIndex, now time.Time, notes *commitNotes, res *ChangeResult) (func() error, error) {
	meta, ok, err := loadStream(tx, c.Key)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: the conversation does not exist", ErrUnknownEntry)
	}
	path, err := activePath(tx, meta, idx)
	if err != nil {
		return nil, err
	}
	var i int
	if c.EntryID == "" && c.Kind == ChangeRegenerate {
		i = -1
		for j := len(path) - 1; j >= 0; j-- {
			if path[j].Type == record.EntryUserMessage {
				i = j
				break
			}
		}
		if i < 0 {
			return nil, fmt.Errorf("%w: the active path has no user message to regenerate", ErrNotOnPath)
		}
	} else if c.EntryID == "" {
		return nil, fmt.Errorf("%w: no entry id", ErrUnknownEntry)
	} else if i, err = findOnPath(tx, meta, path, c.EntryID, true); err != nil {
		return nil, err
	}
	target := path[i]
	payload := target.Payload
	if c.Kind == ChangeRegenerate && len(c.Metadata) > 0 {
		var mp record.MessagePayload
		if err := json.Unmarshal(payload, &mp); err != nil {
			return nil, fmt.Errorf("%w: the message to regenerate: %v", ErrInvalidRecord, err)
		}
		meta := map[string]json.RawMessage{}
		if len(mp.Metadata) > 0 {
			if err := json.Unmarshal(mp.Metadata, &meta); err != nil {
				return nil, fmt.Errorf("%w: the message's metadata: %v", ErrInvalidRecord, err)
			}
		}
		for k, v := range c.Metadata {
			meta[k] = v
		}
		var err error
		if mp.Metadata, err = json.Marshal(meta); err != nil {
			return nil, err
		}
		if payload, err = json.Marshal(mp); err != nil {
			return nil, err
		}
	}
	reason := ReasonRewind
	var turns uint64
	var counted bool
	if c.Kind == ChangeRegenerate {
		reason = ReasonRegenerate
		if turns, counted, err = turnCount(tx, meta, true, c.MaxTurns > 0); err != nil {
			return nil, err
		}
		if err := checkTurnLimit(turns, c.MaxTurns); err != nil {
			return nil, err
		}
	}
	return func() error {
		settled, ids, err := abortUnsettled(tx, meta.id, now, failureOf(c.Kind))
		if err != nil {
			return err
		}
		recs := append(settled, record.TruncatedRecord(target.ParentID, reason))
		subID := ""
		if c.Kind == ChangeRegenerate {
			subID = "sub_" + ulid.Make().String()
			recs = append(recs, record.EntryRecord(record.Entry{Type: record.EntryUserMessage, SubmissionID: subID, Payload: payload}))
		}
		plan, err := appendChunked(tx, c.Key, meta, recs, now, notes)
		if err != nil {
			return err
		}
		inst, err := touchExisting(tx, c.Key.Agent, c.Key.Instance, now)
		if err != nil {
			return err
		}
		*res = ChangeResult{Incarnation: incarnationOf(plan.meta.inc), Offset: record.OffsetOf(plan.pos),
			NextOffset: record.OffsetOf(plan.meta.next), LeafID: target.ParentID, Aborted: ids, UID: inst.UID}
		if subID == "" {
			return nil
		}
		if counted {
			if err := putTurnCount(tx, plan.meta.id, turns+1); err != nil {
				return err
			}
		}
		s := &storedSubmission{Submission: record.Submission{ID: subID, Key: c.Key, Offset: record.OffsetOf(plan.pos),
			Status: record.StatusAdmitted, AdmittedAt: now, UID: inst.UID, EntryID: plan.records[len(plan.records)-1].Entry.ID}}
		if s.Seq, err = tx.Bucket(bucketSubmissions).NextSequence(); err != nil {
			return err
		}
		if err := putSubmission(tx, s); err != nil {
			return err
		}
		if err := tx.Bucket(bucketQueue).Put(pairKey(plan.meta.id, s.Seq), []byte(s.ID)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketOutbox).Put(u64(s.Seq), []byte(s.ID)); err != nil {
			return err
		}
		sub := s.Submission
		res.Submission = &sub
		return nil
	}, nil
}

// forkChunk bounds a fork's batches well inside a batch's limits.
const (
	forkChunkRecords = 512
	forkChunkBytes   = 4 << 20
)

func prepareFork(tx *bolt.Tx, c Change, idx *pathIndex, now time.Time, notes *commitNotes, res *ChangeResult) (func() error, error) {
	meta, ok, err := loadStream(tx, c.Key)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: the conversation does not exist", ErrUnknownEntry)
	}
	if c.Target.Agent != c.Key.Agent {
		return nil, fmt.Errorf("%w: a fork stays with its agent", ErrInvalidName)
	}
	path, err := activePath(tx, meta, idx)
	if err != nil {
		return nil, err
	}
	i, err := findOnPath(tx, meta, path, c.EntryID, false)
	if err != nil {
		return nil, err
	}
	if _, exists, err := loadStream(tx, c.Target); err != nil {
		return nil, err
	} else if exists {
		return nil, fmt.Errorf("%w: %s", ErrConflict, c.Target)
	}
	newInstance := c.Target.Instance != c.Key.Instance
	var inst instanceMeta
	if newInstance {
		if instanceExists(tx, c.Target.Agent, c.Target.Instance) {
			return nil, fmt.Errorf("%w: instance %s exists", ErrConflict, c.Target.Instance)
		}
		if inst, _, err = generationFor(tx, c.Target.Agent, c.Target.Instance, "", now); err != nil {
			return nil, err
		}
	}
	from, err := json.Marshal(ForkedPayload{Agent: c.Key.Agent, Instance: c.Key.Instance, Session: c.Key.Session,
		Incarnation: incarnationOf(meta.inc), EntryID: c.EntryID})
	if err != nil {
		return nil, err
	}
	recs := []record.Record{record.EntryRecord(record.Entry{Type: EntryForked, Payload: from})}
	for _, e := range path[:i+1] {
		recs = append(recs, record.EntryRecord(e.Entry))
	}
	return func() error {
		tm := newStream(now)
		var first *batchPlan
		for len(recs) > 0 {
			n, size := 0, 0
			for n < len(recs) && n < forkChunkRecords && (n == 0 || size+len(recs[n].Entry.Payload) < forkChunkBytes) {
				size += len(recs[n].Entry.Payload)
				n++
			}
			plan, err := planAppend(tx, c.Target, tm, recs[:n], now)
			if err != nil {
				return err
			}
			if err := plan.store(tx, notes); err != nil {
				return err
			}
			if first == nil {
				first = plan
			}
			tm, recs = plan.meta, recs[n:]
		}
		if newInstance {
			if err := touchInstance(tx, c.Target.Agent, c.Target.Instance, inst, false, now); err != nil {
				return err
			}
		} else if inst, err = touchExisting(tx, c.Target.Agent, c.Target.Instance, now); err != nil {
			return err
		}
		*res = ChangeResult{Incarnation: incarnationOf(tm.inc), Offset: record.OffsetOf(first.pos), NextOffset: record.OffsetOf(tm.next),
			LeafID: tm.leaf, UID: inst.UID, TargetInstance: c.Target.Instance, TargetSession: c.Target.Session}
		return nil
	}, nil
}

// instanceExists is true for an instance with a row or with any stream.
func instanceExists(tx *bolt.Tx, agent, instance string) bool {
	if tx.Bucket(bucketInstances).Get(instanceKey(agent, instance)) != nil {
		return true
	}
	sp := []byte(agent + "\x00" + instance + "\x00")
	k, _ := tx.Bucket(bucketStreams).Cursor().Seek(sp)
	return k != nil && bytes.HasPrefix(k, sp)
}

func prepareReset(tx *bolt.Tx, c Change, now time.Time, notes *commitNotes, res *ChangeResult) (func() error, error) {
	meta, ok, err := loadStream(tx, c.Key)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrInstanceNotFound, c.Key)
	}
	old, prevInc, prevTail := meta.id, incarnationOf(meta.inc), record.OffsetOf(meta.next)
	meta.inc, meta.next, meta.leaf = ulid.Make(), 0, ""
	return func() error {
		if err := deleteRecords(tx, old); err != nil {
			return err
		}
		if err := forgetTurnCount(tx, old); err != nil {
			return err
		}
		settled, ids, err := abortUnsettled(tx, old, now, failureOf(ChangeReset))
		if err != nil {
			return err
		}
		if err := meta.store(tx, c.Key); err != nil {
			return err
		}
		notes.reset(c.Key, meta)
		next := meta.next
		if len(settled) > 0 {
			plan, err := appendChunked(tx, c.Key, meta, settled, now, notes)
			if err != nil {
				return err
			}
			next = plan.meta.next
		}
		inst, err := touchExisting(tx, c.Key.Agent, c.Key.Instance, now)
		if err != nil {
			return err
		}
		*res = ChangeResult{Incarnation: incarnationOf(meta.inc), Offset: record.Start, NextOffset: record.OffsetOf(next), Aborted: ids, UID: inst.UID,
			PreviousIncarnation: prevInc, PreviousTail: prevTail}
		return nil
	}, nil
}

func prepareDelete(tx *bolt.Tx, c Change, now time.Time, notes *commitNotes, res *ChangeResult) (func() error, error) {
	agent, instance := c.Key.Agent, c.Key.Instance
	inst, hasRow, err := loadInstance(tx, agent, instance)
	if err != nil {
		return nil, err
	}
	type stream struct {
		key  record.Key
		meta streamMeta
	}
	var streams []stream
	sp := []byte(agent + "\x00" + instance + "\x00")
	cur := tx.Bucket(bucketStreams).Cursor()
	for k, v := cur.Seek(sp); k != nil && bytes.HasPrefix(k, sp); k, v = cur.Next() {
		m, err := decodeStreamMeta(v)
		if err != nil {
			return nil, err
		}
		streams = append(streams, stream{record.Key{Agent: agent, Instance: instance, Session: string(k[len(sp):])}, m})
	}
	if !hasRow && len(streams) == 0 {
		return nil, fmt.Errorf("%w: %s/%s", ErrInstanceNotFound, agent, instance)
	}
	if !hasRow {
		inst.UID = newUID() // a stream written without a delivery: name what ends
	}
	return func() error {
		*res = ChangeResult{UID: inst.UID, Sessions: []string{}, Aborted: []string{}, Purged: c.Purge}
		for _, st := range streams {
			settled, ids, err := abortUnsettled(tx, st.meta.id, now, failureOf(ChangeDelete))
			if err != nil {
				return err
			}
			if err := forgetTurnCount(tx, st.meta.id); err != nil {
				return err
			}
			res.Aborted = append(res.Aborted, ids...)
			res.Sessions = append(res.Sessions, st.key.Session)
			if c.Purge {
				if err := purgeStream(tx, st.key, st.meta.id); err != nil {
					return err
				}
			} else {
				m := st.meta
				if len(settled) > 0 {
					// Kept with the records, for an operator who recovers them.
					plan, err := appendChunked(tx, st.key, m, settled, now, notes)
					if err != nil {
						return err
					}
					m = plan.meta
				}
				if err := tx.Bucket(bucketArchive).Put([]byte(agent+"\x00"+instance+"\x00"+inst.UID+"\x00"+st.key.Session), m.encode()); err != nil {
					return err
				}
			}
			if err := tx.Bucket(bucketStreams).Delete(encodeKey(st.key)); err != nil {
				return err
			}
			notes.gone(st.key)
		}
		if hasRow {
			if err := tx.Bucket(bucketActivity).Delete(activityKey(agent, instance, inst.Activity)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketInstances).Delete(instanceKey(agent, instance)); err != nil {
				return err
			}
		}
		if c.Purge {
			// Idempotency keys point at purged submissions.
			if err := deletePrefix(tx.Bucket(bucketIdem), []byte(agent+"\x00"+instance+"\x00")); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketEnded).Put(endedKey(agent, instance, inst.UID), u64(uint64(now.UnixNano())))
	}, nil
}

// purgeStream removes a stream's records, their index and the submissions
// they name. Every submission has its user message in its stream, so the
// records name them all (those of earlier incarnations went with their
// reset's settlement entries, which also name them).
func purgeStream(tx *bolt.Tx, key record.Key, streamID uint64) error {
	subs := map[string]bool{}
	if err := streamEntries(tx, streamID, func(_, sub string) {
		if sub != "" {
			subs[sub] = true
		}
	}); err != nil {
		return err
	}
	if err := deleteRecords(tx, streamID); err != nil {
		return err
	}
	b := tx.Bucket(bucketSubmissions)
	for id := range subs {
		// Only the stream's own: a fork's copies name the source's.
		if s, err := getSubmission(tx, id); err != nil || s.Key != key {
			continue
		}
		if err := b.Delete([]byte(id)); err != nil {
			return err
		}
	}
	return nil
}

// Checkpoint is a user message of the active path: a place to rewind to.
type Checkpoint struct {
	EntryID      string        `json:"entryId"`
	SubmissionID string        `json:"submissionId"`
	Offset       record.Offset `json:"offset"`
	Timestamp    time.Time     `json:"timestamp"`
	Preview      string        `json:"preview"`
}

// previewLength bounds a checkpoint's preview, in characters.
const previewLength = 80

// Checkpoints returns the user messages of the active path, oldest first.
// Offset is where the batch holding the message starts.
func (db *DB) Checkpoints(ctx context.Context, key record.Key) ([]Checkpoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := key.Validate(); err != nil {
		return nil, fmt.Errorf("checkpoints %s: %w", key, err)
	}
	out := []Checkpoint{}
	err := db.view(func(tx *bolt.Tx) error {
		meta, ok, err := loadStream(tx, key)
		if err != nil || !ok {
			return err
		}
		path, err := activePath(tx, meta, nil)
		if err != nil {
			return err
		}
		for _, e := range path {
			if e.Type != record.EntryUserMessage {
				continue
			}
			out = append(out, Checkpoint{EntryID: e.ID, SubmissionID: e.SubmissionID, Offset: record.OffsetOf(e.pos),
				Timestamp: e.Timestamp, Preview: preview(e.Payload)})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoints %s: %w", key, err)
	}
	return out, nil
}

func preview(payload json.RawMessage) string {
	var p record.MessagePayload
	if json.Unmarshal(payload, &p) != nil {
		return ""
	}
	var b strings.Builder
	for _, part := range p.Parts {
		if part.Type == record.PartText {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(part.Text)
		}
	}
	s := strings.Join(strings.Fields(b.String()), " ")
	if utf8.RuneCountInString(s) <= previewLength {
		return s
	}
	r := []rune(s)
	return string(r[:previewLength-1]) + "…"
}
