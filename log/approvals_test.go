package log_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// waitingSub admits a delivery, starts it as turn_1 and makes it ask for
// approval of two tool calls.
func waitingSub(t *testing.T, db *clog.DB, key record.Key) (record.Submission, clog.Appended) {
	t.Helper()
	ctx := context.Background()
	sub, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userEntry("refund me")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.MarkPublished(ctx, sub.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: key, Start: []string{sub.ID}, TurnID: "turn_1"}); err != nil {
		t.Fatal(err)
	}
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{
		{Type: record.PartToolCall, ToolCallID: "call_1", ToolName: "refund", Input: json.RawMessage(`{"amount":5}`)},
		{Type: record.PartToolCall, ToolCallID: "call_2", ToolName: "email", Input: json.RawMessage(`{"to":"a"}`)},
	}})
	ap, err := db.Write(ctx, clog.Write{Key: key, TurnID: "turn_1",
		Records: []record.Record{record.EntryRecord(record.Entry{Type: record.EntryAssistantMessage, SubmissionID: sub.ID, TurnID: "turn_1", Payload: p})},
		Await: &clog.Await{SubmissionID: sub.ID, Timeout: time.Hour, Requests: []record.ApprovalRequest{
			{ApprovalID: "apr_1", ToolCallID: "call_1", ToolName: "refund", Input: json.RawMessage(`{"amount":5}`)},
			{ApprovalID: "apr_2", ToolCallID: "call_2", ToolName: "email", Input: json.RawMessage(`{"to":"a"}`)},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := db.Submission(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	return s, ap
}

func pendingIDs(s record.Submission) []string {
	var out []string
	for _, p := range s.Pending {
		out = append(out, p.ApprovalID)
	}
	return out
}

func decision(id string, approved bool) record.ApprovalDecisionPayload {
	return record.ApprovalDecisionPayload{ApprovalID: id, Approved: approved, Principal: &record.Principal{Subject: "alice"}}
}

// A turn that asks stores its request with the status change; the status
// JSON lists what is pending; deciding one of two leaves the other; the
// last decision puts the submission back in the outbox, and a start
// resumes it once.
func TestApprovalFlow(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	s, ap := waitingSub(t, db, testKey)
	if s.Status != record.StatusInputRequired || !s.Waiting() || s.Resumable() || s.Runnable() || s.Status.Terminal() {
		t.Fatalf("after await: %+v", s)
	}
	if s.ApprovalDeadline.Sub(s.WaitingSince) != time.Hour || s.StartedAt.IsZero() {
		t.Fatalf("deadline %v since %v", s.ApprovalDeadline, s.WaitingSince)
	}
	js, _ := json.Marshal(s)
	var wire struct {
		Status  string                   `json:"status"`
		Pending []record.ApprovalRequest `json:"pending"`
	}
	if err := json.Unmarshal(js, &wire); err != nil || wire.Status != "input_required" || len(wire.Pending) != 2 ||
		wire.Pending[0].ToolName != "refund" || string(wire.Pending[1].Input) != `{"to":"a"}` {
		t.Fatalf("status JSON %s", js)
	}
	// The request is the batch's last record, after the assistant message.
	if n := len(ap.Records); n != 2 || ap.Records[1].Entry.Type != record.EntryApprovalRequest || ap.Records[1].Entry.TurnID != "turn_1" ||
		ap.Records[1].Entry.SubmissionID != s.ID {
		t.Fatalf("await batch %+v", ap.Records)
	}
	// Waiting: not in the outbox, still unsettled, not startable.
	if un, _ := db.Unpublished(ctx, 10); len(un) != 0 {
		t.Fatalf("outbox while waiting: %+v", un)
	}
	if p, _ := db.Pending(ctx, testKey); len(p) != 1 || p[0].ID != s.ID {
		t.Fatalf("pending %+v", p)
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, Start: []string{s.ID}, TurnID: "turn_2"}); !errors.Is(err, clog.ErrSubmissionState) {
		t.Fatalf("start of a waiting submission: %v", err)
	}
	if ss, err := db.Sessions(ctx, testKey.Agent, testKey.Instance); err != nil || len(ss) != 1 || ss[0].Waiting != 1 || ss[0].Queued != 0 || ss[0].Running != 0 {
		t.Fatalf("sessions %+v %v", ss, err)
	}

	d1, replayed, err := db.Decide(ctx, clog.Decide{Key: testKey, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_2", false)}})
	if err != nil || replayed || d1.Resumed || !d1.Submission.Waiting() || !slices.Equal(pendingIDs(d1.Submission), []string{"apr_1"}) {
		t.Fatalf("first decision %+v %v %v", d1, replayed, err)
	}
	if d1.Offset != ap.NextOffset {
		t.Fatalf("decision offset %s, want %s", d1.Offset, ap.NextOffset)
	}
	rd, err := db.Read(ctx, testKey, d1.Offset, 0)
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := rd.Batches[0].Records.Decode()
	var dp record.ApprovalDecisionPayload
	if len(recs) != 1 || recs[0].Entry.Type != record.EntryApprovalDecision || json.Unmarshal(recs[0].Entry.Payload, &dp) != nil ||
		dp.ApprovalID != "apr_2" || dp.Approved || dp.Principal.Subject != "alice" {
		t.Fatalf("decision read back: %+v", recs)
	}
	if un, _ := db.Unpublished(ctx, 10); len(un) != 0 {
		t.Fatalf("outbox after one of two: %+v", un)
	}

	d2, _, err := db.Decide(ctx, clog.Decide{Key: testKey, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{
		{ApprovalID: "apr_1", Approved: true, Input: json.RawMessage(`{"amount":3}`)}}})
	if err != nil || !d2.Resumed || d2.Submission.Waiting() || len(d2.Submission.Pending) != 0 || !d2.Submission.Resumable() || !d2.Submission.Runnable() {
		t.Fatalf("last decision %+v %v", d2, err)
	}
	got, _ := db.Submission(ctx, s.ID)
	if !got.Resumable() || len(got.Approvals) != 2 || string(got.Approvals[0].EditedInput) != `{"amount":3}` || !got.Approvals[0].Approved ||
		got.Approvals[1].Approved || !got.Approvals[1].Decided || got.Approvals[1].DecidedAt.IsZero() {
		t.Fatalf("stored approvals %+v", got.Approvals)
	}
	if un, _ := db.Unpublished(ctx, 10); len(un) != 1 || un[0].ID != s.ID {
		t.Fatalf("outbox after the last decision: %+v", un)
	}
	if _, _, err := db.Decide(ctx, clog.Decide{Key: testKey, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_1", true)}}); !errors.Is(err, clog.ErrNotWaiting) {
		t.Fatalf("decision on a resumable submission: %v", err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, Start: []string{s.ID}, TurnID: "turn_2"}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	run, _ := db.Submission(ctx, s.ID)
	if run.Status != record.StatusRunning || run.TurnID != "turn_2" || !run.StartedAt.Equal(s.StartedAt) || run.Runnable() {
		t.Fatalf("resumed %+v", run)
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, Start: []string{s.ID}, TurnID: "turn_3"}); !errors.Is(err, clog.ErrSubmissionState) {
		t.Fatalf("second start: %v", err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, TurnID: "turn_2", Settle: []record.Settlement{{SubmissionID: s.ID, Outcome: record.OutcomeCompleted}}}); err != nil {
		t.Fatal(err)
	}
	if done, _ := db.Submission(ctx, s.ID); done.Status != record.StatusCompleted || len(done.Pending) != 0 {
		t.Fatalf("settled %+v", done)
	}
}

// The refusals of an await: each leaves the submission running.
func TestAwaitRefusals(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	sub, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("x")}})
	if err != nil {
		t.Fatal(err)
	}
	req := func(id, call string) record.ApprovalRequest {
		return record.ApprovalRequest{ApprovalID: id, ToolCallID: call, ToolName: "t", Input: json.RawMessage(`{}`)}
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, TurnID: "turn_1", Await: &clog.Await{SubmissionID: sub.ID, Requests: []record.ApprovalRequest{req("a", "c")}}}); !errors.Is(err, clog.ErrSubmissionState) {
		t.Fatalf("await of an admitted submission: %v", err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, Start: []string{sub.ID}, TurnID: "turn_1"}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		w    clog.Write
		want error
	}{
		"no requests":        {clog.Write{TurnID: "turn_1", Await: &clog.Await{SubmissionID: sub.ID}}, clog.ErrInvalidRecord},
		"duplicate approval": {clog.Write{TurnID: "turn_1", Await: &clog.Await{SubmissionID: sub.ID, Requests: []record.ApprovalRequest{req("a", "c1"), req("a", "c2")}}}, clog.ErrInvalidRecord},
		"duplicate call":     {clog.Write{TurnID: "turn_1", Await: &clog.Await{SubmissionID: sub.ID, Requests: []record.ApprovalRequest{req("a", "c"), req("b", "c")}}}, clog.ErrInvalidRecord},
		"empty id":           {clog.Write{TurnID: "turn_1", Await: &clog.Await{SubmissionID: sub.ID, Requests: []record.ApprovalRequest{req("", "c")}}}, clog.ErrInvalidRecord},
		"another turn":       {clog.Write{TurnID: "turn_9", Await: &clog.Await{SubmissionID: sub.ID, Requests: []record.ApprovalRequest{req("a", "c")}}}, clog.ErrSubmissionState},
		"and settled too": {clog.Write{TurnID: "turn_1", Await: &clog.Await{SubmissionID: sub.ID, Requests: []record.ApprovalRequest{req("a", "c")}},
			Settle: []record.Settlement{{SubmissionID: sub.ID, Outcome: record.OutcomeCompleted}}}, clog.ErrSubmissionState},
		"unknown submission": {clog.Write{TurnID: "turn_1", Await: &clog.Await{SubmissionID: "sub_x", Requests: []record.ApprovalRequest{req("a", "c")}}}, clog.ErrSubmissionNotFound},
	} {
		c.w.Key = testKey
		if _, err := db.Write(ctx, c.w); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if s, _ := db.Submission(ctx, sub.ID); s.Status != record.StatusRunning || len(s.Approvals) != 0 {
		t.Fatalf("after refusals: %+v", s)
	}
}

// Decide's refusals come in the documented order and write nothing.
func TestDecideRefusalOrder(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	s, _ := waitingSub(t, db, testKey)
	other := record.Key{Agent: "echo", Instance: "i1", Session: "other"}
	settled, _, err := db.Admit(ctx, clog.Admission{Key: other, Records: []record.Record{userEntry("y")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: other, TurnID: "t", Settle: []record.Settlement{{SubmissionID: settled.ID, Outcome: record.OutcomeCompleted}}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Decide(ctx, clog.Decide{Key: testKey, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_1", true)}}); err != nil {
		t.Fatal(err)
	}
	before, _ := db.Read(ctx, testKey, record.Start, 0)
	bad := errors.New("approved is not a boolean")
	for _, c := range []struct {
		name string
		d    clog.Decide
		want error
	}{
		{"unknown submission", clog.Decide{SubmissionID: "sub_nope", IDs: []string{"zzz"}, Malformed: bad}, clog.ErrSubmissionNotFound},
		{"another agent", clog.Decide{Key: record.Key{Agent: "other", Instance: "i1"}, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_2", true)}}, clog.ErrSubmissionNotFound},
		{"another instance", clog.Decide{Key: record.Key{Agent: "echo", Instance: "i2"}, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_2", true)}}, clog.ErrSubmissionNotFound},
		{"not waiting, unknown id too", clog.Decide{SubmissionID: settled.ID, Decisions: []record.ApprovalDecisionPayload{decision("zzz", true)}, Malformed: bad}, clog.ErrNotWaiting},
		{"unknown approval", clog.Decide{SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_2", true), decision("zzz", true)}}, clog.ErrUnknownApproval},
		{"unknown approval of a malformed body", clog.Decide{SubmissionID: s.ID, IDs: []string{"zzz"}, Malformed: bad}, clog.ErrUnknownApproval},
		{"already decided", clog.Decide{SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_2", true), decision("apr_1", false)}, Malformed: bad}, clog.ErrAlreadyDecided},
		{"malformed", clog.Decide{SubmissionID: s.ID, IDs: []string{"apr_2"}, Malformed: bad}, clog.ErrInvalidRecord},
		{"no decisions", clog.Decide{SubmissionID: s.ID}, clog.ErrInvalidRecord},
		{"input with a denial", clog.Decide{SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{{ApprovalID: "apr_2", Input: json.RawMessage(`{}`)}}}, clog.ErrInvalidRecord},
		{"twice in one body", clog.Decide{SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_2", true), decision("apr_2", false)}}, clog.ErrInvalidRecord},
	} {
		if c.d.Key.Agent == "" {
			c.d.Key = testKey
		}
		_, _, err := db.Decide(ctx, c.d)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if c.want == clog.ErrInvalidRecord && c.d.Malformed != nil && !errors.Is(err, bad) {
			t.Errorf("%s: %v does not carry the malformation", c.name, err)
		}
	}
	after, _ := db.Read(ctx, testKey, record.Start, 0)
	if after.NextOffset != before.NextOffset {
		t.Fatalf("a refused decision wrote: %s -> %s", before.NextOffset, after.NextOffset)
	}
	if got, _ := db.Submission(ctx, s.ID); !slices.Equal(pendingIDs(got), []string{"apr_2"}) {
		t.Fatalf("pending after refusals %v", pendingIDs(got))
	}
}

// A decision with an idempotency key replays its first answer, even once
// the submission no longer waits; the key with another body is refused.
func TestDecideIdempotency(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	s, _ := waitingSub(t, db, testKey)
	d := clog.Decide{Key: testKey, SubmissionID: s.ID, IdempotencyKey: "k1", RequestHash: "h1",
		Decisions: []record.ApprovalDecisionPayload{decision("apr_1", true), decision("apr_2", false)}}
	first, replayed, err := db.Decide(ctx, d)
	if err != nil || replayed || !first.Resumed {
		t.Fatalf("%+v %v %v", first, replayed, err)
	}
	again, replayed, err := db.Decide(ctx, d)
	if err != nil || !replayed || again.Offset != first.Offset || again.NextOffset != first.NextOffset || !again.Resumed ||
		again.Submission.ID != s.ID || again.Submission.Status != record.StatusInputRequired {
		t.Fatalf("replay %+v %v %v", again, replayed, err)
	}
	d.RequestHash = "h2"
	if _, _, err := db.Decide(ctx, d); !errors.Is(err, clog.ErrIdempotencyKeyReused) {
		t.Fatalf("key with another body: %v", err)
	}
	// The same key for a delivery is another request too.
	if _, _, err := db.Admit(ctx, clog.Admission{Key: testKey, Records: []record.Record{userEntry("z")}, IdempotencyKey: "k1", RequestHash: "h1"}); !errors.Is(err, clog.ErrIdempotencyKeyReused) {
		t.Fatalf("admission with a decision's key: %v", err)
	}
	// One decision batch only.
	rd, _ := db.Read(ctx, testKey, first.Offset, 0)
	if len(rd.Batches) != 1 || rd.NextOffset != first.NextOffset {
		t.Fatalf("after replay: %+v", rd)
	}
}

// Rewind, reset and delete void a waiting submission (settled aborted),
// and a later decision is not waiting.
func TestChangeVoidsWaiting(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []clog.ChangeKind{clog.ChangeRewind, clog.ChangeReset, clog.ChangeDelete} {
		t.Run(string(kind), func(t *testing.T) {
			db := openTestDB(t, nil)
			s, _ := waitingSub(t, db, testKey)
			c := clog.Change{Kind: kind, Key: testKey}
			if kind == clog.ChangeRewind {
				c.EntryID = s.EntryID
			}
			res, _, err := db.Change(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(res.Aborted, s.ID) {
				t.Fatalf("aborted %v, want %s", res.Aborted, s.ID)
			}
			got, err := db.Submission(ctx, s.ID)
			if err != nil || got.Status != record.StatusAborted || len(got.Pending) != 0 || got.Waiting() || got.Resumable() {
				t.Fatalf("voided %+v %v", got, err)
			}
			if _, _, err := db.Decide(ctx, clog.Decide{Key: testKey, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("zzz", true)}}); !errors.Is(err, clog.ErrNotWaiting) {
				t.Fatalf("decision after %s: %v", kind, err)
			}
			if un, _ := db.Unpublished(ctx, 10); len(un) != 0 {
				t.Fatalf("outbox %+v", un)
			}
		})
	}
}

// A wait and its decisions are in the file: a reopened log (as after a
// kill -9 between the calls) has the same pending list, refuses a second
// decision on a decided request and resumes exactly once.
func TestApprovalsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "convlog.db")
	open := func() *clog.DB {
		db, err := clog.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	db := open()
	s, _ := waitingSub(t, db, testKey)
	if _, _, err := db.Decide(ctx, clog.Decide{Key: testKey, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_1", true)}}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = open()
	got, err := db.Submission(ctx, s.ID)
	if err != nil || !got.Waiting() || !slices.Equal(pendingIDs(got), []string{"apr_2"}) || !got.ApprovalDeadline.Equal(s.ApprovalDeadline) {
		t.Fatalf("reopened %+v %v", got, err)
	}
	if _, _, err := db.Decide(ctx, clog.Decide{Key: testKey, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_1", false)}}); !errors.Is(err, clog.ErrAlreadyDecided) {
		t.Fatalf("second decision after reopen: %v", err)
	}
	if un, _ := db.Unsettled(ctx, 10); len(un) != 1 || un[0].ID != s.ID || un[0].Status != record.StatusInputRequired {
		t.Fatalf("unsettled %+v", un)
	}
	if d, _, err := db.Decide(ctx, clog.Decide{Key: testKey, SubmissionID: s.ID, Decisions: []record.ApprovalDecisionPayload{decision("apr_2", true)}}); err != nil || !d.Resumed {
		t.Fatalf("last decision %+v %v", d, err)
	}
	if _, err := db.Write(ctx, clog.Write{Key: testKey, Start: []string{s.ID}, TurnID: "turn_2"}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := clog.Check(path, clog.CheckFull, 0); err != nil {
		t.Fatalf("check of a file with approvals: %v", err)
	}
}
