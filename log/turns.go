package log

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/convlog/convlog/log/record"
	bolt "go.etcd.io/bbolt"
)

// An agent's MaxTurns is a limit of deliveries per session: the user
// messages with a submission in the stream's current incarnation (a rewind
// keeps them, a reset removes them). It is checked in the admitting
// transaction, so racing deliveries cannot both take the last turn, in
// this process or any other.
//
// The count is kept in bucketTurns only for the streams whose admissions
// asked for a limit: other streams pay nothing. A missing count is made by
// one scan of the stream, inside the transaction; every change that could
// make a kept count wrong (a reset, a delete, a write of user messages
// outside an admission) drops it instead of adjusting it.
var bucketTurns = []byte("turns") // streamID(8) -> count(8)

// turnCount is the stream's count and whether it is kept (known). With
// need, a count not kept is made by a scan.
func turnCount(tx *bolt.Tx, meta streamMeta, exists, need bool) (n uint64, known bool, err error) {
	if !exists {
		return 0, need, nil
	}
	if v := tx.Bucket(bucketTurns).Get(u64(meta.id)); len(v) == 8 {
		return binary.BigEndian.Uint64(v), true, nil
	}
	if !need {
		return 0, false, nil
	}
	c := tx.Bucket(bucketBatches).Cursor()
	for k, v := c.Seek(u64(meta.id)); k != nil && binary.BigEndian.Uint64(k) == meta.id; k, v = c.Next() {
		_, array, err := decodeBatchHeader(v)
		if err != nil {
			return 0, false, err
		}
		var recs []struct {
			Entry *struct {
				Type         string `json:"type"`
				SubmissionID string `json:"submissionId"`
			} `json:"entry"`
		}
		if err := json.Unmarshal(array, &recs); err != nil {
			return 0, false, fmt.Errorf("turn count: %w", err)
		}
		for _, r := range recs {
			if r.Entry != nil && r.Entry.Type == record.EntryUserMessage && r.Entry.SubmissionID != "" {
				n++
			}
		}
	}
	return n, true, nil
}

// checkTurnLimit refuses an admission to a stream that has had max turns.
func checkTurnLimit(n uint64, max int) error {
	if max > 0 && n >= uint64(max) {
		return fmt.Errorf("%w: the session has had its %d turns", ErrTurnLimit, max)
	}
	return nil
}

// turnsIn is how many of recs count as turns.
func turnsIn(recs []record.Record) uint64 {
	var n uint64
	for _, r := range recs {
		if r.Kind == record.KindEntry && r.Entry != nil && r.Entry.Type == record.EntryUserMessage && r.Entry.SubmissionID != "" {
			n++
		}
	}
	return n
}

func putTurnCount(tx *bolt.Tx, streamID, n uint64) error {
	return tx.Bucket(bucketTurns).Put(u64(streamID), u64(n))
}

// forgetTurnCount drops a kept count; the next limited admission recounts.
func forgetTurnCount(tx *bolt.Tx, streamID uint64) error {
	return tx.Bucket(bucketTurns).Delete(u64(streamID))
}
