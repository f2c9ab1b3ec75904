package service

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
)

func pairs(texts ...string) []msg {
	out := []msg{}
	for _, t := range texts {
		out = append(out, msg{"user", t}, msg{"assistant", t})
	}
	return out
}

func TestLifecycleRewindRegenerateFork(t *testing.T) {
	svc, _ := testService(t, nil)
	r := raw{t, "http://" + svc.Addr()}
	for _, text := range []string{"one", "two", "three"} {
		r.settled("i1", r.deliver("i1", "default", text).SubmissionID)
	}
	cps := r.checkpoints("i1", "default")
	if len(cps) != 3 || cps[1].Preview != "two" || cps[0].Offset != record.Start {
		t.Fatalf("checkpoints %+v", cps)
	}
	_, recs := r.fresh("i1", "default")
	if got := messagesOf(recs); !reflect.DeepEqual(got, pairs("one", "two", "three")) {
		t.Fatalf("before: %v", got)
	}

	// Rewind to before "two": the path is "one" and its answer.
	var rw struct {
		LeafID     string        `json:"leafId"`
		Offset     record.Offset `json:"offset"`
		NextOffset record.Offset `json:"nextOffset"`
		Aborted    []string      `json:"aborted"`
	}
	r.must(200, "POST", "/agents/echo/i1/rewind", `{"entryId":"`+cps[1].EntryID+`"}`, &rw)
	_, recs = r.fresh("i1", "default")
	if got := messagesOf(recs); !reflect.DeepEqual(got, pairs("one")) {
		t.Fatalf("after rewind: %v", got)
	}
	last := recs[len(recs)-1]
	if last.Kind != record.KindTruncated || last.Reason != "rewind" || last.RewoundTo == "" || last.NewLeafID != rw.LeafID || len(rw.Aborted) != 0 {
		t.Fatalf("truncation %+v, result %+v", last, rw)
	}
	// Reading from the answer's offset starts with the truncation.
	var p page
	r.must(200, "GET", "/agents/echo/i1/conversation?offset="+string(rw.Offset), "", &p)
	if first, _ := p.Batches[0].Records.Decode(); first[0].Kind != record.KindTruncated {
		t.Fatalf("from %s: %+v", rw.Offset, first)
	}

	// Errors: unknown entry, off the path, not a user message, no entry.
	r.errCode(404, "not_found", "POST", "/agents/echo/i1/rewind", `{"entryId":"nope"}`)
	r.errCode(409, "cannot_rewind", "POST", "/agents/echo/i1/rewind", `{"entryId":"`+cps[2].EntryID+`"}`)
	answer := projectionIDs(recs)[1]
	r.errCode(409, "cannot_rewind", "POST", "/agents/echo/i1/rewind", `{"entryId":"`+answer+`"}`)
	r.errCode(400, "bad_request", "POST", "/agents/echo/i1/rewind", `{}`)
	r.errCode(400, "bad_request", "POST", "/agents/echo/i1/rewind", `{"entryId":"x","bogus":1}`)
	r.errCode(404, "not_found", "POST", "/agents/echo/nosuch/rewind", `{"entryId":"x"}`)
	r.errCode(404, "not_found", "POST", "/agents/nosuchagent/i1/rewind", `{"entryId":"x"}`)

	// Regenerate the last user message: 202 like a POST, then the same
	// message answered again.
	r.settled("i1", r.deliver("i1", "default", "four").SubmissionID)
	var acc accepted
	r.must(202, "POST", "/agents/echo/i1/regenerate", "", &acc)
	if acc.SubmissionID == "" || acc.UID == "" || !strings.Contains(acc.UpdatesURL, "/stream?session=default&offset=") {
		t.Fatalf("regenerate: %+v", acc)
	}
	if s := r.settled("i1", acc.SubmissionID); s.Status != record.StatusCompleted {
		t.Fatalf("regenerated submission %+v", s)
	}
	_, recs = r.fresh("i1", "default")
	if got := messagesOf(recs); !reflect.DeepEqual(got, pairs("one", "four")) {
		t.Fatalf("after regenerate: %v", got)
	}
	// Regenerate a named user message.
	cps = r.checkpoints("i1", "default")
	r.must(202, "POST", "/agents/echo/i1/regenerate", `{"entryId":"`+cps[0].EntryID+`"}`, &acc)
	r.settled("i1", acc.SubmissionID)
	_, recs = r.fresh("i1", "default")
	if got := messagesOf(recs); !reflect.DeepEqual(got, pairs("one")) {
		t.Fatalf("after regenerate of the first: %v", got)
	}

	// Fork into a new session and a new instance: 201; the fork starts
	// with where it came from; the source is untouched.
	r.settled("i1", r.deliver("i1", "default", "five").SubmissionID)
	_, recs = r.fresh("i1", "default")
	ids := projectionIDs(recs)
	var fk struct {
		InstanceID, Session, UID string
		Incarnation              record.Incarnation
	}
	r.must(201, "POST", "/agents/echo/i1/fork", `{"entryId":"`+ids[1]+`","session":"alt"}`, &fk)
	if fk.InstanceID != "i1" || fk.Session != "alt" || fk.Incarnation == "" {
		t.Fatalf("fork %+v", fk)
	}
	_, frecs := r.fresh("i1", "alt")
	if got := messagesOf(frecs); !reflect.DeepEqual(got, pairs("one")) {
		t.Fatalf("fork: %v", got)
	}
	if e := frecs[0].Entry; e == nil || e.Type != clog.EntryForked || !strings.Contains(string(e.Payload), `"entryId":"`+ids[1]+`"`) {
		t.Fatalf("fork's first record %+v", frecs[0])
	}
	r.errCode(409, "conflict", "POST", "/agents/echo/i1/fork", `{"entryId":"`+ids[1]+`","session":"alt"}`)
	r.errCode(404, "not_found", "POST", "/agents/echo/i1/fork", `{"entryId":"nope","session":"alt2"}`)
	r.must(201, "POST", "/agents/echo/i1/fork", `{"entryId":"`+ids[2]+`","instanceId":"i2"}`, &fk)
	if fk.InstanceID != "i2" || fk.Session != "default" || fk.UID == "" {
		t.Fatalf("fork to an instance %+v", fk)
	}
	_, frecs = r.fresh("i2", "default")
	if got := messagesOf(frecs); !reflect.DeepEqual(got, []msg{{"user", "one"}, {"assistant", "one"}, {"user", "five"}}) {
		t.Fatalf("fork to i2: %v", got)
	}
	r.errCode(409, "conflict", "POST", "/agents/echo/i1/fork", `{"entryId":"`+ids[1]+`","instanceId":"i2","session":"other"}`)
	// A fork without a session name gets one.
	r.must(201, "POST", "/agents/echo/i1/fork", `{"entryId":"`+ids[1]+`"}`, &fk)
	if !strings.HasPrefix(fk.Session, "fork-") {
		t.Fatalf("generated fork session %+v", fk)
	}
	_, after := r.fresh("i1", "default")
	if !reflect.DeepEqual(messagesOf(after), messagesOf(recs)) {
		t.Fatal("the source changed")
	}
}

// projectionIDs are the entry ids of the projected messages.
func projectionIDs(recs []record.Record) []string {
	var ids []string
	for _, m := range projection.Project(recs).Messages {
		ids = append(ids, m.ID)
	}
	return ids
}

func TestLifecycleIdempotencyAndGenerations(t *testing.T) {
	svc, _ := testService(t, nil)
	r := raw{t, "http://" + svc.Addr()}
	acc := r.deliver("g1", "default", "hello")
	if acc.UID == "" {
		t.Fatalf("no uid in %+v", acc)
	}
	r.settled("g1", acc.SubmissionID)
	p, _ := r.fresh("g1", "default")
	if p.UID != acc.UID {
		t.Fatalf("conversation uid %q, delivery's %q", p.UID, acc.UID)
	}
	// The current uid goes through; another is stale, with the current.
	r.must(202, "POST", "/agents/echo/g1", `{"message":"x","uid":"`+acc.UID+`"}`, nil)
	e := r.errCode(409, "stale_generation", "POST", "/agents/echo/g1", `{"message":"x","uid":"gen_other"}`)
	if e["uid"] != acc.UID {
		t.Fatalf("stale_generation %v", e)
	}

	// A rewind with an Idempotency-Key: a retry answers the same, with
	// nothing done twice; the key with another request is a 422.
	cps := r.checkpoints("g1", "default")
	body := `{"entryId":"` + cps[1].EntryID + `"}`
	h := map[string]string{"Idempotency-Key": "k1"}
	st1, _, b1 := r.do("POST", "/agents/echo/g1/rewind", body, h)
	st2, h2, b2 := r.do("POST", "/agents/echo/g1/rewind", body, h)
	if st1 != 200 || st2 != 200 || string(b1) != string(b2) || h2.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s / %d %s %v", st1, b1, st2, b2, h2)
	}
	_, recs := r.fresh("g1", "default")
	n := 0
	for _, rec := range recs {
		if rec.Kind == record.KindTruncated {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d truncations after a retried rewind", n)
	}
	if st, _, b := r.do("POST", "/agents/echo/g1/reset", "", h); st != 422 || !strings.Contains(string(b), "idempotency_key_reused") {
		t.Fatalf("key reused for a reset: %d %s", st, b)
	}

	// Reset: a new incarnation; an old offset is a 400 naming it.
	var rs struct {
		Incarnation record.Incarnation `json:"incarnation"`
		Offset      record.Offset      `json:"offset"`
	}
	r.must(200, "POST", "/agents/echo/g1/reset", `{"session":"default"}`, &rs)
	if rs.Incarnation == p.Incarnation || rs.Offset != record.Start {
		t.Fatalf("reset %+v (was %s)", rs, p.Incarnation)
	}
	e = r.errCode(400, "unknown_offset", "GET", "/agents/echo/g1/conversation?offset="+string(p.NextOffset), "")
	if e["incarnation"] != string(rs.Incarnation) {
		t.Fatalf("unknown_offset %v", e)
	}
	r.errCode(404, "not_found", "POST", "/agents/echo/g1/reset", `{"session":"nosuch"}`)

	// Listings.
	r.settled("g2", r.deliver("g2", "default", "b").SubmissionID)
	r.settled("g2", r.deliver("g2", "s2", "c").SubmissionID)
	var insts struct {
		Instances []struct {
			InstanceID string   `json:"instanceId"`
			UID        string   `json:"uid"`
			Sessions   []string `json:"sessions"`
		} `json:"instances"`
		NextCursor *string `json:"nextCursor"`
	}
	r.must(200, "GET", "/agents/echo?limit=1", "", &insts)
	if len(insts.Instances) != 1 || insts.Instances[0].InstanceID != "g2" || !reflect.DeepEqual(insts.Instances[0].Sessions, []string{"default", "s2"}) || insts.NextCursor == nil {
		t.Fatalf("first page %+v", insts)
	}
	r.must(200, "GET", "/agents/echo?limit=1&cursor="+*insts.NextCursor, "", &insts)
	if len(insts.Instances) != 1 || insts.Instances[0].InstanceID != "g1" || insts.NextCursor != nil {
		t.Fatalf("second page %+v", insts)
	}
	r.errCode(400, "invalid_cursor", "GET", "/agents/echo?cursor=AAAA", "")
	r.errCode(400, "invalid_limit", "GET", "/agents/echo?limit=0", "")
	r.errCode(404, "not_found", "GET", "/agents/nosuchagent", "")
	var sess struct {
		Sessions []struct {
			Session     string             `json:"session"`
			Incarnation record.Incarnation `json:"incarnation"`
			TailOffset  record.Offset      `json:"tailOffset"`
			Running     int                `json:"running"`
			Queued      int                `json:"queued"`
		} `json:"sessions"`
	}
	r.must(200, "GET", "/agents/echo/g2/sessions", "", &sess)
	if len(sess.Sessions) != 2 || sess.Sessions[1].Session != "s2" || sess.Sessions[1].TailOffset == record.Start || sess.Sessions[0].Incarnation == "" {
		t.Fatalf("sessions %+v", sess)
	}
	r.errCode(404, "not_found", "GET", "/agents/echo/nosuch/sessions", "")

	// Delete: reads answer as for no conversation, the next delivery is a
	// new generation, and the old uid is stale.
	var del struct {
		UID      string   `json:"uid"`
		Sessions []string `json:"sessions"`
	}
	r.must(200, "DELETE", "/agents/echo/g2", "", &del)
	if del.UID == "" || !reflect.DeepEqual(del.Sessions, []string{"default", "s2"}) {
		t.Fatalf("delete %+v", del)
	}
	p, recs = r.fresh("g2", "default")
	if p.Incarnation != "" || len(recs) != 0 || p.UID != "" {
		t.Fatalf("after delete: %+v", p)
	}
	r.errCode(404, "not_found", "DELETE", "/agents/echo/g2", "")
	e = r.errCode(409, "stale_generation", "POST", "/agents/echo/g2", `{"message":"x","uid":"`+del.UID+`"}`)
	if e["uid"] != nil {
		t.Fatalf("stale after delete: %v", e)
	}
	acc2 := r.deliver("g2", "default", "reborn")
	if acc2.UID == "" || acc2.UID == del.UID {
		t.Fatalf("new generation %+v (old %s)", acc2, del.UID)
	}
	r.settled("g2", acc2.SubmissionID)
	// Purge removes the records and the submissions.
	r.must(200, "DELETE", "/agents/echo/g2?purge=true", "", nil)
	r.errCode(404, "not_found", "GET", "/agents/echo/g2/submissions/"+acc2.SubmissionID, "")
	r.errCode(400, "bad_request", "DELETE", "/agents/echo/g1?purge=maybe", "")
}

func TestLifecycleAbortsRunningTurn(t *testing.T) {
	svc, _ := testService(t, func(c *Config) { c.EchoDelay = 20 * time.Millisecond })
	r := raw{t, "http://" + svc.Addr()}
	first := r.deliver("a1", "default", "short")
	r.settled("a1", first.SubmissionID)
	long := strings.Repeat("word ", 2000)
	acc := r.deliver("a1", "default", long)
	eventually(t, "the long turn runs", func() bool {
		var s record.Submission
		r.must(200, "GET", "/agents/echo/a1/submissions/"+acc.SubmissionID, "", &s)
		return s.Status == record.StatusRunning
	})
	// Delivered once the long turn runs: before, the runner could take
	// both into one turn (echo's policy is join) and nothing would queue.
	queued := r.deliver("a1", "default", "queued behind")
	cps := r.checkpoints("a1", "default")
	var rw struct {
		Aborted []string `json:"aborted"`
	}
	r.must(200, "POST", "/agents/echo/a1/rewind", `{"entryId":"`+cps[1].EntryID+`"}`, &rw)
	if s := r.settled("a1", acc.SubmissionID); s.Status != record.StatusAborted {
		t.Fatalf("running turn after rewind: %+v", s)
	}
	if s := r.settled("a1", queued.SubmissionID); s.Status != record.StatusAborted || !reflect.DeepEqual(rw.Aborted, []string{queued.SubmissionID}) {
		t.Fatalf("queued after rewind: %+v, aborted %v", s, rw.Aborted)
	}
	_, recs := r.fresh("a1", "default")
	if got := messagesOf(recs); !reflect.DeepEqual(got, pairs("short")) {
		t.Fatalf("after rewind: %v", got)
	}
	checkSettledOnce(t, recs, first.SubmissionID, acc.SubmissionID, queued.SubmissionID)

	// Delete while a turn runs: it settles aborted, a reader gets the
	// ended frame.
	acc = r.deliver("a1", "default", long)
	rd := follow(t, r.base, "a1", "default")
	eventually(t, "the turn runs", func() bool {
		var s record.Submission
		r.must(200, "GET", "/agents/echo/a1/submissions/"+acc.SubmissionID, "", &s)
		return s.Status == record.StatusRunning
	})
	r.must(200, "DELETE", "/agents/echo/a1", "", nil)
	if s := r.settled("a1", acc.SubmissionID); s.Status != record.StatusAborted {
		t.Fatalf("running turn after delete: %+v", s)
	}
	select {
	case <-rd.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end after the delete")
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if !rd.ended || rd.frames[len(rd.frames)-1] != "ended" {
		t.Fatalf("frames %v", rd.frames)
	}
}

// checkSettledOnce: each submission has exactly one settlement record.
func checkSettledOnce(t testing.TB, recs []record.Record, ids ...string) {
	t.Helper()
	n := map[string]int{}
	for _, r := range recs {
		if r.Kind == record.KindEntry && r.Entry.Type == record.EntrySettlement {
			n[r.Entry.SubmissionID]++
		}
	}
	for _, id := range ids {
		if n[id] != 1 {
			t.Fatalf("submission %s has %d settlements", id, n[id])
		}
	}
}

// TestLifecycleReaderStaysConnected: one SSE reader, connected from the
// start, through deliveries, rewind, regenerate, fork and reset, ends with
// exactly the messages of a fresh read.
func TestLifecycleReaderStaysConnected(t *testing.T) {
	svc, _ := testService(t, nil)
	r := raw{t, "http://" + svc.Addr()}
	r.settled("c1", r.deliver("c1", "default", "alpha").SubmissionID)
	rd := follow(t, r.base, "c1", "default")
	same := func(step string) {
		t.Helper()
		var p page
		var recs []record.Record
		eventually(t, step+": the reader catches up", func() bool {
			p, recs = r.fresh("c1", "default")
			return rd.caughtUp(p)
		})
		if got, want := messagesOf(rd.snapshot()), messagesOf(recs); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: reader %v, fresh read %v", step, got, want)
		}
	}
	same("start")
	for _, text := range []string{"beta", "gamma"} {
		r.settled("c1", r.deliver("c1", "default", text).SubmissionID)
	}
	same("deliveries")
	cps := r.checkpoints("c1", "default")
	r.must(200, "POST", "/agents/echo/c1/rewind", `{"entryId":"`+cps[2].EntryID+`"}`, nil)
	same("rewind")
	var acc accepted
	r.must(202, "POST", "/agents/echo/c1/regenerate", "", &acc)
	r.settled("c1", acc.SubmissionID)
	same("regenerate")
	r.must(201, "POST", "/agents/echo/c1/fork", `{"entryId":"`+cps[0].EntryID+`","session":"f"}`, nil)
	same("fork")
	r.must(200, "POST", "/agents/echo/c1/reset", "", nil)
	same("reset")
	r.settled("c1", r.deliver("c1", "default", "after reset").SubmissionID)
	same("after reset")
	if got := messagesOf(rd.snapshot()); !reflect.DeepEqual(got, pairs("after reset")) {
		t.Fatalf("end: %v", got)
	}
	rd.mu.Lock()
	frames := fmt.Sprint(rd.frames)
	rd.mu.Unlock()
	if !strings.Contains(frames, "reset") {
		t.Fatalf("no reset frame in %s", frames)
	}
}
