package log

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/convlog/convlog/log/record"
	bolt "go.etcd.io/bbolt"
)

// ScanCursor is where a paged scan of unsettled submissions goes on: ""
// is the start, and a page's cursor is "" after the last page. It is
// opaque and stays valid across writes: a submission settled meanwhile is
// skipped, one admitted behind the cursor is in a later page.
type ScanCursor string

// UnsettledPage returns up to limit unsettled submissions of all streams
// from cursor on, in stream order then admission order, and the cursor of
// the next page. Recovery and sweeps page through a backlog with it instead
// of loading it whole.
func (db *DB) UnsettledPage(ctx context.Context, cursor ScanCursor, limit int) ([]record.Submission, ScanCursor, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	from, err := hex.DecodeString(string(cursor))
	if err != nil {
		return nil, "", fmt.Errorf("unsettled page: %w: cursor of %d bytes", ErrInvalidRecord, len(cursor))
	}
	limit = max(limit, 1)
	var out []record.Submission
	var next ScanCursor
	err = db.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketQueue).Cursor()
		k, v := c.Seek(from)
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			s, err := getSubmission(tx, string(v))
			if err != nil {
				return err
			}
			out = append(out, s.Submission)
		}
		if k != nil {
			next = ScanCursor(hex.EncodeToString(k))
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("unsettled page: %w", err)
	}
	return out, next, nil
}
