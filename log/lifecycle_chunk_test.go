package log_test

import (
	"context"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// A rewind or reset of a session with more unsettled submissions than one
// batch holds (a backlog behind slow agents) settles them all, in as many
// batches as needed, instead of being refused. Found by the cluster
// torture: "1106 records in one batch (at most 1024)".
func TestChangeSettlesBacklogOverOneBatch(t *testing.T) {
	db := openTestDB(t, nil)
	ctx := context.Background()
	key := record.Key{Agent: "a", Instance: "i", Session: "big"}
	n := record.MaxRecordsBatch + 100
	var first record.Submission
	for i := range n {
		s := admitText(t, db, key, "m")
		if i == 0 {
			first = s
		}
	}
	cps, err := db.Checkpoints(ctx, key)
	if err != nil || len(cps) == 0 || cps[0].SubmissionID != first.ID {
		t.Fatalf("checkpoints: %d %v", len(cps), err)
	}
	res, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeRewind, Key: key, EntryID: cps[0].EntryID})
	if err != nil {
		t.Fatalf("rewind of %d unsettled: %v", n, err)
	}
	if len(res.Aborted) != n {
		t.Fatalf("rewind aborted %d, want %d", len(res.Aborted), n)
	}
	// The answer's offset is the batch that ends with the truncation.
	got, err := db.Read(ctx, key, res.Offset, 1)
	if err != nil || len(got.Batches) != 1 {
		t.Fatalf("read at the rewind's offset: %+v %v", got, err)
	}
	recs, err := got.Batches[0].Records.Decode()
	if err != nil || recs[len(recs)-1].Kind != record.KindTruncated {
		t.Fatalf("the rewind's batch does not end with its truncation: %v", err)
	}
	for range n {
		admitText(t, db, key, "m")
	}
	res, _, err = db.Change(ctx, clog.Change{Kind: clog.ChangeReset, Key: key})
	if err != nil || len(res.Aborted) != n {
		t.Fatalf("reset of %d unsettled: aborted %d, %v", n, len(res.Aborted), err)
	}
	_, all := readAllRecords(t, db, key)
	if len(all) != n {
		t.Fatalf("the new incarnation holds %d records, want %d settlements", len(all), n)
	}
}
