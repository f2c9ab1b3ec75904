package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
)

// The torture's lifecycle changes: while the posters deliver and the
// service is killed, one changer rewinds random sessions (aborting the
// turns that run there) and, every fourth change, resets one.
//
// A rewind removes nothing: the rewound entries stay in the stream, off the
// active path, so the verification finds every submission in the records
// as before, and checks in addition that each acknowledged rewind is in
// the stream where its answer said, with its target off the path.
//
// A reset removes the records of its incarnation. So that the verification
// can still account for every submission in them, the changer reads the
// session whole just before resetting it, with the session quiet: posters
// leave it alone (its lock), and the changer waits until nothing of it is
// queued or running. The reset's answer names the tail it removed; equal
// to the end of that read, it proves the read saw every record the reset
// removed. The read is kept as the session's history.

// tortureRewind is an acknowledged rewind.
type tortureRewind struct {
	Session     string
	EntryID     string
	Incarnation record.Incarnation
	Offset      record.Offset // where its truncation's batch starts
	LeafID      string
}

// tortureReset is an acknowledged reset and what it removed.
type tortureReset struct {
	Session  string
	Removed  *tortureSessionLog // the session read whole just before
	Previous record.Incarnation
	Tail     record.Offset // the tail the reset says it removed
	New      record.Incarnation
}

// changeResult is the answer of a rewind or a reset.
type changeResult struct {
	Incarnation         record.Incarnation `json:"incarnation"`
	LeafID              string             `json:"leafId"`
	Offset              record.Offset      `json:"offset"`
	Aborted             []string           `json:"aborted"`
	PreviousIncarnation record.Incarnation `json:"previousIncarnation"`
	PreviousTailOffset  record.Offset      `json:"previousTailOffset"`
}

// changer makes a change every ~ChangeEvery until stop closes.
func (t *torture) changer(ctx context.Context, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(t.cfg.Seed, 0x6368616e))
	for n := 0; ; n++ {
		d := t.cfg.ChangeEvery/2 + time.Duration(rng.Int64N(int64(t.cfg.ChangeEvery)+1))
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		session := t.sessions[rng.IntN(len(t.sessions))]
		if n%4 == 3 {
			t.resetSession(ctx, session, n)
		} else {
			t.rewindSession(ctx, session, n, rng)
		}
	}
}

// call sends one lifecycle request until the service answers it (a 5xx
// or no answer is retried with the same Idempotency-Key), and returns the
// status and body of the answer.
func (t *torture) call(ctx context.Context, method, path, body, key string) (int, []byte, bool) {
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		var rd io.Reader
		if body != "" {
			rd = bytes.NewReader([]byte(body))
		}
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		req, err := http.NewRequestWithContext(rctx, method, t.base+path, rd)
		if err != nil {
			cancel()
			return 0, nil, false
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := t.hc.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode < 500 {
				cancel()
				return resp.StatusCode, b, true
			}
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 250*time.Millisecond)
	}
	return 0, nil, false
}

func (t *torture) changeProblem(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.changeProblems = append(t.changeProblems, fmt.Sprintf(format, args...))
}

func (t *torture) rewindSession(ctx context.Context, session string, n int, rng *rand.Rand) {
	base := "/agents/" + tortureAgent + "/" + t.instance
	status, b, ok := t.call(ctx, "GET", base+"/checkpoints?session="+url.QueryEscape(session), "", "")
	if !ok {
		return
	}
	var cps struct {
		Checkpoints []struct {
			EntryID string `json:"entryId"`
		} `json:"checkpoints"`
	}
	if status != 200 || json.Unmarshal(b, &cps) != nil {
		t.changeProblem("checkpoints of %s: %d %s", session, status, b)
		return
	}
	if len(cps.Checkpoints) == 0 {
		return
	}
	// Mostly the latest messages, whose turns may still run.
	i := len(cps.Checkpoints) - 1 - rng.IntN(min(len(cps.Checkpoints), 3))
	entry := cps.Checkpoints[i].EntryID
	body := fmt.Sprintf(`{"entryId":%q,"session":%q}`, entry, session)
	status, b, ok = t.call(ctx, "POST", base+"/rewind", body, fmt.Sprintf("%s/rewind-%d", t.instance, n))
	if !ok {
		return
	}
	var res changeResult
	if status != 200 || json.Unmarshal(b, &res) != nil {
		// Only this goroutine changes the path, so the checkpoint it just
		// read is a user message of the path: any refusal is a bug.
		t.changeProblem("rewind of %s to %s: %d %s", session, entry, status, b)
		return
	}
	t.mu.Lock()
	t.rewinds = append(t.rewinds, tortureRewind{Session: session, EntryID: entry, Incarnation: res.Incarnation, Offset: res.Offset, LeafID: res.LeafID})
	t.mu.Unlock()
}

func (t *torture) resetSession(ctx context.Context, session string, n int) {
	lk := t.sessionLocks[session]
	lk.Lock() // posters keep off; the deliveries in flight are answered
	defer lk.Unlock()
	base := "/agents/" + tortureAgent + "/" + t.instance
	// Quiet: nothing queued or running, so nothing writes to the stream
	// between the read and the reset.
	for {
		status, b, ok := t.call(ctx, "GET", base+"/sessions", "", "")
		if !ok {
			return
		}
		var ss struct {
			Sessions []struct {
				Session                  string `json:"session"`
				Running, Queued, Waiting int
			} `json:"sessions"`
		}
		if status == 404 {
			return // nothing delivered yet
		}
		if status != 200 || json.Unmarshal(b, &ss) != nil {
			t.changeProblem("sessions: %d %s", status, b)
			return
		}
		busy, found := false, false
		for _, s := range ss.Sessions {
			if s.Session == session {
				found, busy = true, s.Running+s.Queued+s.Waiting > 0
			}
		}
		if !found {
			return
		}
		if !busy {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	removed, err := t.readSession(ctx, session, false)
	if err != nil {
		t.changeProblem("reading %s before its reset: %v", session, err)
		return
	}
	status, b, ok := t.call(ctx, "POST", base+"/reset", fmt.Sprintf(`{"session":%q}`, session), fmt.Sprintf("%s/reset-%d", t.instance, n))
	if !ok {
		return
	}
	var res changeResult
	if status != 200 || json.Unmarshal(b, &res) != nil {
		t.changeProblem("reset of %s: %d %s", session, status, b)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resets = append(t.resets, tortureReset{Session: session, Removed: removed,
		Previous: res.PreviousIncarnation, Tail: res.PreviousTailOffset, New: res.Incarnation})
}

// verifyChanges checks the acknowledged changes against the records: each
// reset removed exactly what was read before it (and nothing was
// unsettled then), each rewind's truncation is where its answer said, to
// its target's parent, and the target is off the path of its incarnation.
func (r *tortureReport) verifyChanges(in tortureVerifyInput) {
	r.Rewinds, r.Resets = len(in.Rewinds), len(in.Resets)
	for _, p := range in.ChangeProblems {
		r.ChangeErrors++
		r.sample("change: %s", p)
	}
	// Every incarnation of every session: the removed reads and the final.
	byInc := map[record.Incarnation]*tortureSessionLog{}
	for _, rs := range in.Resets {
		if rs.Previous != rs.Removed.Incarnation || rs.Tail != rs.Removed.Next {
			r.ResetsUnaccounted++
			r.sample("reset of %s removed %s up to %q; the read before it saw %s up to %q", rs.Session, rs.Previous, rs.Tail, rs.Removed.Incarnation, rs.Removed.Next)
		}
		byInc[rs.Removed.Incarnation] = rs.Removed
	}
	for _, l := range in.Logs {
		byInc[l.Incarnation] = l
	}
	for _, rw := range in.Rewinds {
		l := byInc[rw.Incarnation]
		if l == nil {
			r.RewindsUnseen++
			r.sample("rewind of %s to before %s: incarnation %s was never read", rw.Session, rw.EntryID, rw.Incarnation)
			continue
		}
		var target *record.Entry
		for _, rec := range l.Records {
			if rec.Kind == record.KindEntry && rec.Entry.ID == rw.EntryID {
				target = rec.Entry
			}
		}
		var trunc *record.Record
		for i, b := range l.Batches {
			if b.Offset == rw.Offset && len(l.BatchRecords[i]) > 0 {
				last := l.BatchRecords[i][len(l.BatchRecords[i])-1]
				trunc = &last
			}
		}
		onPath := false
		for _, m := range projection.Project(l.Records).Messages {
			onPath = onPath || m.ID == rw.EntryID
		}
		switch {
		case target == nil || target.Type != record.EntryUserMessage:
			r.RewindsUnseen++
			r.sample("rewind of %s to before %s: no such user message in %s", rw.Session, rw.EntryID, rw.Incarnation)
		case trunc == nil || trunc.Kind != record.KindTruncated || trunc.Reason != clog.ReasonRewind || trunc.RewoundTo != target.ParentID || rw.LeafID != target.ParentID:
			r.RewindsUnseen++
			r.sample("rewind of %s to before %s: no truncation to %q ending the batch at %q", rw.Session, rw.EntryID, target.ParentID, rw.Offset)
		case onPath:
			r.RewindsUnseen++
			r.sample("rewind of %s to before %s: the entry is still on the active path", rw.Session, rw.EntryID)
		}
	}
}

// sessionLocks keep posters off a session while it is reset.
func newSessionLocks(sessions []string) map[string]*sync.RWMutex {
	m := make(map[string]*sync.RWMutex, len(sessions))
	for _, s := range sessions {
		m[s] = &sync.RWMutex{}
	}
	return m
}
