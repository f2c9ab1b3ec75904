package log_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

func TestSubmissionLifecycle(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)

	s1, replayed, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("hi")}})
	if err != nil || replayed {
		t.Fatalf("admit: %v %v", err, replayed)
	}
	s2, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("again")}})
	if err != nil {
		t.Fatal(err)
	}
	if s1.Status != record.StatusAdmitted || s1.Offset != record.Start || s2.Offset != "1" {
		t.Fatalf("admitted %+v %+v", s1, s2)
	}
	// The user entry carries the submission id and is the first record at
	// the submission's offset.
	res, err := db.Read(ctx, testKey, s2.Offset, 1)
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := res.Batches[0].Records.Decode()
	if recs[0].Entry.SubmissionID != s2.ID || recs[0].Entry.ID != s2.EntryID {
		t.Fatalf("user entry %+v, submission %+v", recs[0].Entry, s2)
	}

	pending, err := db.Pending(ctx, testKey)
	if err != nil || len(pending) != 2 || pending[0].ID != s1.ID || pending[1].ID != s2.ID {
		t.Fatalf("pending %v %v", pending, err)
	}
	first, err := db.PendingFirst(ctx, testKey, 1)
	if err != nil || len(first) != 1 || first[0].ID != s1.ID {
		t.Fatalf("first pending %v %v", first, err)
	}
	if _, err := db.PendingFirst(ctx, testKey, 0); !errors.Is(err, clog.ErrInvalidRecord) {
		t.Fatalf("pending with limit 0: %v", err)
	}
	out, err := db.Unpublished(ctx, 10)
	if err != nil || len(out) != 2 {
		t.Fatalf("outbox %v %v", out, err)
	}
	if err := db.MarkPublished(ctx, s1.ID, s2.ID, "sub_unknown"); err != nil {
		t.Fatal(err)
	}
	if out, _ := db.Unpublished(ctx, 10); len(out) != 0 {
		t.Fatalf("outbox after publish: %v", out)
	}

	if _, err := db.Write(ctx, clog.Write{Key: testKey, Start: []string{s1.ID, s2.ID}, TurnID: "turn_1"}); err != nil {
		t.Fatal(err)
	}
	if s, _ := db.Submission(ctx, s1.ID); s.Status != record.StatusRunning || s.TurnID != "turn_1" || s.StartedAt.IsZero() {
		t.Fatalf("started %+v", s)
	}
	ap, err := db.Write(ctx, clog.Write{Key: testKey, TurnID: "turn_1",
		Records: []record.Record{userEntry("reply")},
		Settle: []record.Settlement{
			{SubmissionID: s1.ID, Outcome: record.OutcomeCompleted, AnsweredBySubmissionID: s2.ID},
			{SubmissionID: s2.ID, Outcome: record.OutcomeCompleted},
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ap.Records) != 3 || ap.Records[1].Entry.Type != record.EntrySettlement || ap.Records[2].Entry.SubmissionID != s2.ID {
		t.Fatalf("settle batch %+v", ap.Records)
	}
	got, _ := db.Submission(ctx, s1.ID)
	if got.Status != record.StatusCompleted || got.AnsweredBySubmissionID != s2.ID || got.SettledAt.IsZero() {
		t.Fatalf("settled %+v", got)
	}
	if p, _ := db.Pending(ctx, testKey); len(p) != 0 {
		t.Fatalf("pending after settle: %v", p)
	}
	_, err = db.Write(ctx, clog.Write{Key: testKey, Settle: []record.Settlement{{SubmissionID: s1.ID, Outcome: record.OutcomeAborted}}})
	if !errors.Is(err, clog.ErrSubmissionSettled) {
		t.Fatalf("settle twice: %v", err)
	}
}

func TestWriteRefusals(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	sub, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("x")}})
	if err != nil {
		t.Fatal(err)
	}
	other := record.Key{Agent: "echo", Instance: "i1", Session: "other"}
	if _, err := db.Append(ctx, other, userEntry("y")); err != nil {
		t.Fatal(err)
	}
	bad := record.Key{Agent: "echo", Instance: "../etc", Session: "default"}
	cases := []struct {
		name string
		w    clog.Write
		want error
	}{
		{"invalid name", clog.Write{Key: bad, Records: []record.Record{userEntry("x")}}, clog.ErrInvalidName},
		{"empty write", clog.Write{Key: testKey}, clog.ErrInvalidRecord},
		{"unknown kind", clog.Write{Key: testKey, Records: []record.Record{{Kind: "bogus"}}}, clog.ErrInvalidRecord},
		{"entry without type", clog.Write{Key: testKey, Records: []record.Record{record.EntryRecord(record.Entry{})}}, clog.ErrInvalidRecord},
		{"bad payload", clog.Write{Key: testKey, Records: []record.Record{record.EntryRecord(record.Entry{Type: "x", Payload: []byte("{")})}}, clog.ErrInvalidRecord},
		{"unknown parent", clog.Write{Key: testKey, Records: []record.Record{record.EntryRecord(record.Entry{Type: "x", ParentID: "nope"})}}, clog.ErrUnknownEntry},
		{"unknown rewind", clog.Write{Key: testKey, Records: []record.Record{record.TruncatedRecord("nope", "r")}}, clog.ErrUnknownEntry},
		{"duplicate id", clog.Write{Key: testKey, Records: []record.Record{record.EntryRecord(record.Entry{ID: sub.EntryID, Type: "x"})}}, clog.ErrDuplicateEntry},
		{"start unknown", clog.Write{Key: testKey, Start: []string{"sub_nope"}}, clog.ErrSubmissionNotFound},
		{"start other stream", clog.Write{Key: other, Start: []string{sub.ID}}, clog.ErrSubmissionState},
		{"bad outcome", clog.Write{Key: testKey, Settle: []record.Settlement{{SubmissionID: sub.ID, Outcome: "meh"}}}, clog.ErrInvalidRecord},
		{"named twice", clog.Write{Key: testKey, Start: []string{sub.ID, sub.ID}}, clog.ErrSubmissionState},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := db.Write(ctx, tc.w); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	// Refusals wrote nothing: the stream still holds its one batch.
	res, err := db.Read(ctx, testKey, record.Start, 0)
	if err != nil || len(res.Batches) != 1 || res.NextOffset != "1" {
		t.Fatalf("after refusals: %+v %v", res, err)
	}
	if s, _ := db.Submission(ctx, sub.ID); s.Status != record.StatusAdmitted {
		t.Fatalf("submission changed: %+v", s)
	}
}

// A refused write that shares a group commit with good writes must not
// disturb them.
func TestRefusalInSharedCommit(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	const n = 200
	errs := make(chan error, n)
	for i := range n {
		go func() {
			rec := userEntry("ok")
			if i%3 == 0 {
				rec = record.Record{Kind: "bogus"}
			}
			_, err := db.Append(ctx, testKey, rec)
			errs <- err
		}()
	}
	bad := 0
	for range n {
		if err := <-errs; err != nil {
			if !errors.Is(err, clog.ErrInvalidRecord) {
				t.Fatal(err)
			}
			bad++
		}
	}
	_, tail, _ := db.Tail(ctx, testKey)
	if bad != (n+2)/3 || tail != record.Offset(itoa(n-bad)) {
		t.Fatalf("bad=%d tail=%s", bad, tail)
	}
	commits, writes := db.CommitStats()
	t.Logf("%d writes in %d commits", writes, commits)
}

func TestIdempotency(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	db := openTestDB(t, &clog.Options{Now: clock, IdempotencyTTL: time.Hour})
	adm := clog.Admission{Key: testKey, Records: []record.Record{userEntry("x")}, IdempotencyKey: "k1", RequestHash: "h1"}

	first, replayed, err := db.Admit(ctx, adm)
	if err != nil || replayed {
		t.Fatal(err, replayed)
	}
	again, replayed, err := db.Admit(ctx, adm)
	if err != nil || !replayed || again.ID != first.ID || again.Offset != first.Offset {
		t.Fatalf("repeat: %+v %v %v", again, replayed, err)
	}
	if _, tail, _ := db.Tail(ctx, testKey); tail != "1" {
		t.Fatalf("repeat appended: tail %s", tail)
	}
	other := adm
	other.RequestHash = "h2"
	if _, _, err := db.Admit(ctx, other); !errors.Is(err, clog.ErrIdempotencyKeyReused) {
		t.Fatalf("reuse: %v", err)
	}
	// Another instance has its own key space.
	elsewhere := adm
	elsewhere.Key.Instance = "i2"
	if _, replayed, err := db.Admit(ctx, elsewhere); err != nil || replayed {
		t.Fatalf("other instance: %v %v", err, replayed)
	}
	now = now.Add(2 * time.Hour)
	if n, err := db.ExpireIdempotencyKeys(ctx, 100); err != nil || n != 2 {
		t.Fatalf("expired %d %v", n, err)
	}
	fresh, replayed, err := db.Admit(ctx, other)
	if err != nil || replayed || fresh.ID == first.ID {
		t.Fatalf("after expiry: %+v %v %v", fresh, replayed, err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestRejectIfBusy(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	busy := clog.Admission{Key: testKey, Records: []record.Record{userEntry("x")}, RejectIfBusy: true, IdempotencyKey: "k", RequestHash: "h"}
	first, _, err := db.Admit(ctx, busy)
	if err != nil {
		t.Fatal(err)
	}
	// A retry of the admitted request still gets its original answer.
	again, replayed, err := db.Admit(ctx, busy)
	if err != nil || !replayed || again.ID != first.ID {
		t.Fatalf("replay: %+v %v %v", again, replayed, err)
	}
	other := busy
	other.IdempotencyKey = ""
	if _, _, err := db.Admit(ctx, other); !errors.Is(err, clog.ErrSessionBusy) {
		t.Fatalf("busy: %v", err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, Settle: []record.Settlement{{SubmissionID: first.ID, Outcome: record.OutcomeCompleted}}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Admit(ctx, other); err != nil {
		t.Fatalf("idle again: %v", err)
	}
}

func TestAdmitStartTurn(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	// Idle session: admitted already running, in one commit.
	first, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("a")}, StartTurn: "turn_1"})
	if err != nil || first.Status != record.StatusRunning || first.TurnID != "turn_1" || first.StartedAt.IsZero() {
		t.Fatalf("idle: %+v %v", first, err)
	}
	// Busy session: admitted as usual.
	second, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("b")}, StartTurn: "turn_2"})
	if err != nil || second.Status != record.StatusAdmitted || second.TurnID != "" {
		t.Fatalf("busy: %+v %v", second, err)
	}
	if p, _ := db.Pending(ctx, testKey); len(p) != 2 || p[0].Status != record.StatusRunning {
		t.Fatalf("pending %+v", p)
	}
}

func TestUnsettledPages(t *testing.T) {
	db := openTestDB(t, nil)
	ctx := context.Background()
	var want []string
	for i := range 7 {
		k := record.Key{Agent: "a", Instance: "i", Session: "s" + strconv.Itoa(i%3)}
		s, _, err := db.Admit(ctx, clog.Admission{Key: k, Records: []record.Record{userEntry("x")}})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, s.ID)
	}
	all, err := db.Unsettled(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var cur clog.ScanCursor
	for pages := 0; ; pages++ {
		page, next, err := db.UnsettledPage(ctx, cur, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page {
			got = append(got, s.ID)
		}
		if next == "" {
			if pages != 2 {
				t.Fatalf("%d pages", pages+1)
			}
			break
		}
		cur = next
	}
	if len(got) != len(want) {
		t.Fatalf("paged %v, want %d", got, len(want))
	}
	for i := range all {
		if all[i].ID != got[i] {
			t.Fatalf("page order %v, scan order %+v", got, all)
		}
	}
	if _, _, err := db.UnsettledPage(ctx, "zz", 3); !errors.Is(err, clog.ErrInvalidRecord) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// A settlement entry names the turn that started its submission, whether
// the write settling it names that turn (its entry is made before the write
// queues), another one, or none (made in the transaction); its payload is
// the settlement.
func TestSettlementEntryNamesTheStartingTurn(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	cases := []struct{ name, settleTurn string }{{"same turn", "turn_a"}, {"other turn", "turn_b"}, {"no turn", ""}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sub, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("x")}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Write(ctx, clog.Write{Key: testKey, Start: []string{sub.ID}, TurnID: "turn_a"}); err != nil {
				t.Fatal(err)
			}
			ap, err := db.Write(ctx, clog.Write{Key: testKey, TurnID: c.settleTurn,
				Settle: []record.Settlement{{SubmissionID: sub.ID, Outcome: record.OutcomeFailed, Error: &record.Failure{Code: "x", Message: "m"}}}})
			if err != nil {
				t.Fatal(err)
			}
			res, err := db.Read(ctx, testKey, ap.Offset, 1)
			if err != nil {
				t.Fatal(err)
			}
			recs, err := res.Batches[0].Records.Decode()
			if err != nil {
				t.Fatal(err)
			}
			e := recs[0].Entry
			if e.Type != record.EntrySettlement || e.TurnID != "turn_a" || e.SubmissionID != sub.ID || e.ID == "" || e.Timestamp.IsZero() {
				t.Fatalf("settlement entry %+v", e)
			}
			if e.ParentID != ap.Records[0].Entry.ParentID || e.ID != ap.Records[0].Entry.ID {
				t.Fatalf("stored %+v, returned %+v", e, ap.Records[0].Entry)
			}
			var st record.Settlement
			if err := json.Unmarshal(e.Payload, &st); err != nil || st.SubmissionID != sub.ID || st.Outcome != record.OutcomeFailed || st.Error == nil || st.Error.Code != "x" {
				t.Fatalf("payload %s: %+v %v", e.Payload, st, err)
			}
		})
	}
}
