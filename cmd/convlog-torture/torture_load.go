package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

// tortureAdmission is a delivery that got a 202.
type tortureAdmission struct {
	SubmissionID string
	Text         string
	Session      string
	Offset       record.Offset
	// Attempts is how many times the request was sent; Unanswered is how
	// many of those ended without any HTTP answer.
	Attempts   int
	Unanswered int
	// LastSent is when the attempt that got the 202 was sent: a
	// submission admitted before it was admitted by an earlier attempt
	// whose answer the kill swallowed.
	LastSent time.Time
}

// tortureTally counts what the posters saw besides 202s.
type tortureTally struct {
	Requests      int      // attempts sent
	NoAnswer      int      // attempts that got no HTTP answer (service down or killed)
	ServerErrors  int      // 5xx answers (retried)
	ClientErrors  int      // other 4xx answers: the request was wrong, never retried
	ErrorSamples  []string // the first few client errors
	Abandoned     int      // requests given up unanswered at the end
	AbandonedText []string // their texts: an entry with one of them is explained
	SameTextTwice int      // a text answered with a second, different submission id
	SameIDTwice   int      // a submission id answered for two different texts
}

// poster delivers unique texts ("c3-17") to random sessions, one request at
// a time, until stop closes. Each request carries an Idempotency-Key, and a
// request that got no answer is resent unchanged until it gets one.
func (t *torture) poster(ctx context.Context, stop <-chan struct{}, id int) {
	rng := rand.New(rand.NewPCG(t.cfg.Seed, uint64(id)+1))
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		if ctx.Err() != nil {
			return
		}
		text := fmt.Sprintf("c%d-%d", id, n) + strings.Repeat(" w", t.cfg.Words-1)
		session := t.sessions[rng.IntN(len(t.sessions))]
		// A session being reset is left alone: another is picked.
		lk := t.sessionLocks[session]
		if !lk.TryRLock() {
			n--
			continue
		}
		t.deliverUntilAnswered(ctx, text, session)
		lk.RUnlock()
	}
}

// deliverUntilAnswered sends one delivery until the service answers it.
func (t *torture) deliverUntilAnswered(ctx context.Context, text, session string) {
	req := wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: text}, Session: session}
	key := t.instance + "/" + text
	a := &tortureAdmission{Text: text, Session: session}
	backoff := 10 * time.Millisecond
	for {
		if ctx.Err() != nil {
			t.mu.Lock()
			t.tally.Abandoned++
			t.tally.AbandonedText = append(t.tally.AbandonedText, text)
			t.mu.Unlock()
			return
		}
		a.Attempts++
		a.LastSent = time.Now()
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		acc, err := t.client.Deliver(actx, tortureAgent, t.instance, req, key)
		cancel()
		if err == nil {
			a.SubmissionID, a.Offset = acc.SubmissionID, acc.Offset
			t.recordAdmission(a)
			return
		}
		var apiErr *wire.APIError
		switch {
		case errors.As(err, &apiErr) && apiErr.Status >= 500:
			t.mu.Lock()
			t.tally.Requests++
			t.tally.ServerErrors++
			t.mu.Unlock()
		case errors.As(err, &apiErr):
			t.mu.Lock()
			t.tally.Requests++
			t.tally.ClientErrors++
			if len(t.tally.ErrorSamples) < 5 {
				t.tally.ErrorSamples = append(t.tally.ErrorSamples, fmt.Sprintf("%s: %v", text, err))
			}
			t.mu.Unlock()
			return
		default:
			// Counted even when the final error is a refused dial:
			// net/http resends a request with an Idempotency-Key on a
			// fresh connection when a reused one fails, so an attempt
			// that reached the service before the kill can end with
			// the restart's refusal.
			a.Unanswered++
			t.mu.Lock()
			t.tally.Requests++
			t.tally.NoAnswer++
			t.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 250*time.Millisecond)
	}
}

func (t *torture) recordAdmission(a *tortureAdmission) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.tally.Requests++
	if prev, ok := t.byText[a.Text]; ok && prev != a.SubmissionID {
		t.tally.SameTextTwice++
	} else if !ok {
		t.byText[a.Text] = a.SubmissionID
	}
	if prev, dup := t.admissions[a.SubmissionID]; dup {
		if prev.Text != a.Text {
			t.tally.SameIDTwice++
		}
	} else {
		t.admissions[a.SubmissionID] = a
	}
}

// tortureReader tails one session over SSE from offset 0, across kills,
// and checks that the conversation frames chain: each frame's offset is the
// previous frame's nextOffset, its id is its nextOffset, and the
// incarnation changes only by a reset frame (or, when the reset happened
// while the reader was away, by a 400 unknown_offset at its resume, which
// names the new incarnation). It keeps what it saw of each incarnation for
// comparison with the log at the end.
type tortureReader struct {
	t       *torture
	id      int
	session string

	mu         sync.Mutex
	expected   record.Offset // the next frame's offset
	inc        record.Incarnation
	frames     []tortureBatch // of the incarnation inc
	past       []tortureSegment
	problems   []string
	nproblems  int
	reconnects int
	failed     bool // stopped for good (an error frame)
	restart    bool // reconnect from "0": a resume landed in a new incarnation
}

// tortureSegment is what a reader saw of an incarnation that a reset ended.
type tortureSegment struct {
	Incarnation record.Incarnation
	Frames      []tortureBatch
}

// newIncarnation files the frames seen so far and starts over at "0" of
// inc; r.mu is held.
func (r *tortureReader) newIncarnation(inc record.Incarnation) {
	r.past = append(r.past, tortureSegment{Incarnation: r.inc, Frames: r.frames})
	r.inc, r.frames, r.expected = inc, nil, record.Start
}

// tortureBatch is one batch as a reader or the verifier saw it.
type tortureBatch struct {
	Offset, Next record.Offset
	IDs          []string // entry ids, "~kind" for records that are not entries
}

func tortureBatchIDs(recs []record.Record) []string {
	ids := make([]string, len(recs))
	for i, r := range recs {
		if r.Kind == record.KindEntry && r.Entry != nil {
			ids[i] = r.Entry.ID
		} else {
			ids[i] = "~" + r.Kind
		}
	}
	return ids
}

func (r *tortureReader) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problemLocked(format, args...)
}

// problemLocked records a problem; r.mu is held. Only the first few are
// kept, but any one fails the reader.
func (r *tortureReader) problemLocked(format string, args ...any) {
	r.nproblems++
	if len(r.problems) < 10 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

func (r *tortureReader) position() record.Offset {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expected
}

func (r *tortureReader) run(ctx context.Context) {
	c := r.t.client
	lastID := "" // the Last-Event-ID a browser would resume with
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		var sr *client.StreamReader
		var err error
		if lastID == "" {
			sr, err = c.Stream(ctx, tortureAgent, r.t.instance, r.session, record.Start)
		} else {
			sr, err = c.Resume(ctx, tortureAgent, r.t.instance, r.session, lastID)
		}
		if err != nil {
			var apiErr *wire.APIError
			if errors.As(err, &apiErr) && apiErr.Code == wire.CodeUnknownOffset && apiErr.Incarnation != "" {
				r.mu.Lock()
				changed := apiErr.Incarnation != r.inc
				if changed {
					// Reset while we were away: start over in the new one.
					r.newIncarnation(apiErr.Incarnation)
					lastID = ""
				}
				r.mu.Unlock()
				if changed {
					continue
				}
			}
			if errors.As(err, &apiErr) && apiErr.Status < 500 {
				// The service refused to resume from an id it gave us.
				r.problem("reopening at Last-Event-ID %q: %v", lastID, err)
				r.mu.Lock()
				r.failed = true
				r.mu.Unlock()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 250*time.Millisecond)
			continue
		}
		backoff = 10 * time.Millisecond
		stopped := r.consume(sr, lastID != "")
		r.mu.Lock()
		restart := r.restart
		r.restart = false
		r.mu.Unlock()
		if restart {
			lastID = ""
		} else if id := sr.LastEventID(); id != "" {
			lastID = id
		}
		sr.Close()
		if stopped || ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		r.reconnects++
		if lastID != "" && record.Offset(lastID) != r.expected {
			r.problemLocked("Last-Event-ID %q but the next frame is due at %q", lastID, r.expected)
		}
		r.mu.Unlock()
	}
}

// consume reads frames until the stream ends. It returns true when the
// reader must stop for good: an error frame.
func (r *tortureReader) consume(sr *client.StreamReader, resumed bool) bool {
	first := resumed // the first frame of a resumed stream
	for {
		f, err := sr.Next()
		if err != nil {
			var apiErr *wire.APIError
			if errors.As(err, &apiErr) {
				r.problem("error frame after offset %q: %v", r.position(), err)
				r.mu.Lock()
				r.failed = true
				r.mu.Unlock()
				return true
			}
			// The end of the body or a reset: the service went away.
			return false
		}
		if f.Type == transport.FrameReset {
			r.mu.Lock()
			if f.ID != string(record.Start) {
				r.problemLocked("reset frame with id %q, not 0", f.ID)
			}
			var rf struct {
				Incarnation record.Incarnation `json:"incarnation"`
			}
			if json.Unmarshal(f.Raw, &rf) != nil || rf.Incarnation == "" || rf.Incarnation == r.inc {
				r.problemLocked("reset frame %s after incarnation %s", f.Raw, r.inc)
			}
			r.newIncarnation(rf.Incarnation)
			r.mu.Unlock()
			first = false
			continue
		}
		if f.Type != wire.FrameConversation {
			continue
		}
		r.mu.Lock()
		if first && r.inc != "" && f.Incarnation != r.inc {
			// Resumed at an offset that the new incarnation (reset while
			// we were away) also has: start over from "0" in it.
			r.newIncarnation(f.Incarnation)
			r.restart = true
			r.mu.Unlock()
			return false
		}
		first = false
		switch {
		case f.BatchOffset != r.expected:
			r.problemLocked("frame at offset %q (next %q) when %q was due: a %s", f.BatchOffset, f.NextOffset, r.expected, tortureGapOrRepeat(r.expected, f.BatchOffset))
		case f.ID != string(f.NextOffset):
			r.problemLocked("frame id %q is not its nextOffset %q", f.ID, f.NextOffset)
		case r.inc != "" && f.Incarnation != r.inc:
			r.problemLocked("incarnation changed from %s to %s at offset %q", r.inc, f.Incarnation, f.BatchOffset)
		}
		if r.inc == "" {
			r.inc = f.Incarnation
		}
		r.frames = append(r.frames, tortureBatch{Offset: f.BatchOffset, Next: f.NextOffset, IDs: tortureBatchIDs(f.Records)})
		r.expected = f.NextOffset
		r.mu.Unlock()
	}
}

// tortureGapOrRepeat names an offset mismatch for a human. Offsets are
// opaque to the protocol; the torture peeks at their decimal form only to
// describe.
func tortureGapOrRepeat(due, got record.Offset) string {
	var d, g uint64
	if _, err := fmt.Sscan(string(due), &d); err != nil {
		return "mismatch"
	}
	if _, err := fmt.Sscan(string(got), &g); err != nil {
		return "mismatch"
	}
	if g > d {
		return fmt.Sprintf("gap of %d records", g-d)
	}
	return fmt.Sprintf("repeat of %d records", d-g)
}

// ensureService restarts the service if it died by itself after the kill
// cycles (settling, reading). Callers retry their request afterwards; an
// error means the torture gives up.
func (t *torture) ensureService(ctx context.Context) error {
	t.svcMu.Lock()
	defer t.svcMu.Unlock()
	if t.svc.exited() && !t.svc.killed.Load() {
		return t.unexpectedExit(ctx)
	}
	return nil
}
