package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// settleAll waits until every admitted submission is settled, within
// SettleTimeout, and returns the last status seen of each (absent when the
// service never answered for it). A quick pass finds the unsettled ones;
// only those are long-polled.
func (t *torture) settleAll(ctx context.Context) (map[string]record.Submission, error) {
	ctx, cancelAll := context.WithCancelCause(ctx)
	defer cancelAll(nil)
	ctx, cancel := context.WithTimeout(ctx, t.cfg.SettleTimeout)
	defer cancel()
	t.mu.Lock()
	ids := slices.Sorted(maps.Keys(t.admissions))
	t.mu.Unlock()

	var mu sync.Mutex
	statuses := make(map[string]record.Submission, len(ids))
	// get asks for one submission's status, retrying while the service is
	// unreachable, until ctx ends.
	get := func(id string, wait time.Duration) (record.Submission, bool) {
		backoff := 10 * time.Millisecond
		for {
			sub, err := t.client.Submission(ctx, tortureAgent, t.instance, id, wait)
			if err == nil {
				mu.Lock()
				statuses[id] = sub
				mu.Unlock()
				return sub, true
			}
			var apiErr *wire.APIError
			if errors.As(err, &apiErr) && apiErr.Status < 500 {
				return record.Submission{}, false // a 404: it is missing, which the verification reports
			}
			if ctx.Err() != nil {
				return record.Submission{}, false
			}
			if err := t.ensureService(ctx); err != nil {
				cancelAll(err)
				return record.Submission{}, false
			}
			select {
			case <-ctx.Done():
				return record.Submission{}, false
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 250*time.Millisecond)
		}
	}
	pass := func(ids []string, workers int, wait time.Duration) (pending []string) {
		work := make(chan string)
		var wg sync.WaitGroup
		var pmu sync.Mutex
		for range min(workers, max(len(ids), 1)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range work {
					sub, ok := get(id, wait)
					for ok && !sub.Status.Terminal() && wait > 0 && ctx.Err() == nil {
						sub, ok = get(id, wait)
					}
					if !ok || !sub.Status.Terminal() {
						pmu.Lock()
						pending = append(pending, id)
						pmu.Unlock()
					}
				}
			}()
		}
		for _, id := range ids {
			work <- id
		}
		close(work)
		wg.Wait()
		return pending
	}
	start := time.Now()
	pending := pass(ids, 16, 0)
	if err := context.Cause(ctx); err != nil && err != context.DeadlineExceeded {
		return nil, err
	}
	if len(pending) > 0 {
		t.logf("torture: %d of %d not settled yet; long-polling them", len(pending), len(ids))
		pending = pass(pending, 256, 30*time.Second)
	}
	if err := context.Cause(ctx); err != nil && err != context.DeadlineExceeded {
		return nil, err
	}
	if ctx.Err() != nil && len(pending) > 0 {
		// The bound passed: one last look at what is still open, so the
		// report shows its current state.
		var lcancel context.CancelFunc
		ctx, lcancel = context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer lcancel()
		pending = pass(pending, 16, 0)
	}
	t.logf("torture: settled check done in %s: %d of %d terminal", time.Since(start).Round(time.Millisecond), len(ids)-len(pending), len(ids))
	return statuses, nil
}

// tortureSessionLog is a session's stream as JSON polling from offset 0 read it.
type tortureSessionLog struct {
	Session     string
	Incarnation record.Incarnation
	Batches     []tortureBatch
	Records     []record.Record
	// BatchRecords are the records of each of Batches.
	BatchRecords [][]record.Record
	Next         record.Offset
	Problems     []string // offsets that do not chain, incarnation changes
}

// readAll reads every session from offset 0 to its tail.
func (t *torture) readAll(ctx context.Context) (map[string]*tortureSessionLog, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	logs := map[string]*tortureSessionLog{}
	for _, s := range t.sessions {
		l, err := t.readSession(ctx, s, true)
		if err != nil {
			return nil, err
		}
		logs[s] = l
	}
	return logs, nil
}

// readSession reads one session from offset 0 to its tail. With ensure it
// restarts a service that exited by itself; only the goroutine that runs
// the kill cycles, or one that runs after them, may.
func (t *torture) readSession(ctx context.Context, s string, ensure bool) (*tortureSessionLog, error) {
	{
		l := &tortureSessionLog{Session: s, Next: record.Start}
		backoff := 10 * time.Millisecond
		for {
			res, err := t.client.Read(ctx, tortureAgent, t.instance, s, l.Next, 0)
			if err != nil {
				if tortureStatus(err) >= 400 && tortureStatus(err) < 500 || ctx.Err() != nil {
					return nil, fmt.Errorf("torture: reading session %s at %q: %w", s, l.Next, err)
				}
				if ensure {
					if err := t.ensureService(ctx); err != nil {
						return nil, err
					}
				}
				select {
				case <-ctx.Done():
					return nil, fmt.Errorf("torture: reading session %s: %w", s, ctx.Err())
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 250*time.Millisecond)
				continue
			}
			if res.Incarnation != "" {
				if l.Incarnation != "" && res.Incarnation != l.Incarnation {
					l.Problems = append(l.Problems, fmt.Sprintf("incarnation changed from %s to %s at %q", l.Incarnation, res.Incarnation, l.Next))
				}
				l.Incarnation = res.Incarnation
			}
			if len(res.Batches) > 0 && res.Batches[0].Offset != l.Next {
				l.Problems = append(l.Problems, fmt.Sprintf("a read at %q began with a batch at %q", l.Next, res.Batches[0].Offset))
			}
			for i, b := range res.Batches {
				next := res.NextOffset
				if i+1 < len(res.Batches) {
					next = res.Batches[i+1].Offset
				}
				recs, err := b.Records.Decode()
				if err != nil {
					return nil, fmt.Errorf("torture: session %s batch at %q: %w", s, b.Offset, err)
				}
				l.Batches = append(l.Batches, tortureBatch{Offset: b.Offset, Next: next, IDs: tortureBatchIDs(recs)})
				l.Records = append(l.Records, recs...)
				l.BatchRecords = append(l.BatchRecords, recs)
			}
			l.Next = res.NextOffset
			if res.UpToDate {
				break
			}
		}
		return l, nil
	}
}

func tortureStatus(err error) int {
	var apiErr *wire.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Status
	}
	return 0
}

// waitReaders waits until every live reader has reached the tail the
// verification read.
func (t *torture) waitReaders(ctx context.Context, logs map[string]*tortureSessionLog, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		behind := 0
		for _, r := range t.readers {
			r.mu.Lock()
			if !r.failed && r.expected != logs[r.session].Next {
				behind++
			}
			r.mu.Unlock()
		}
		if behind == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tortureVerifyInput is everything the verification looks at.
type tortureVerifyInput struct {
	Admissions map[string]*tortureAdmission  // what got a 202, by submission id
	Statuses   map[string]record.Submission  // GET submissions/:id at the end
	Logs       map[string]*tortureSessionLog // every session read from 0
	Readers    []*tortureReader
	Tally      tortureTally
	// The lifecycle changes acknowledged, and what went wrong making them.
	Rewinds        []tortureRewind
	Resets         []tortureReset
	ChangeProblems []string
}

// tortureReport is the result. Every count but Admitted must be 0.
type tortureReport struct {
	Config  tortureConfig
	Broker  string
	Dir     string // the working folder, when kept
	Started time.Time

	Cycles          int
	ServiceStarts   int
	BrokerStarts    int
	BrokerKills     int
	BrokerLiveKills int
	WorkerKills     int            // with Cluster
	ProbeFailures   int            // cluster probes not completed (lease lost in an election)
	Stalls          []tortureStall // what each cluster kill cost
	UnexpectedExits int
	ExitNotes       []string
	FinalStop       string
	FinalStopFailed int // the last, graceful stop hung or exited non-zero
	LoadDuration    time.Duration
	Duration        time.Duration
	Verified        bool

	Admitted   int
	Found      int
	Missing    int
	Duplicates int
	// Duplicates, by kind.
	DupUserEntries, DupEntryIDs int
	DupTexts                    int // one text under two submission ids, or one id for two texts
	Unsettled                   int // admitted without exactly one settlement record
	Unsettled0, UnsettledMany   int
	StuckRunning                int // admitted whose status is not terminal at the end
	StuckSessions               int
	GapReaders                  int // readers that saw a gap, a repeat, a changed incarnation or an error frame
	ReaderMismatch              int // readers whose frames differ from the log read by polling
	LogProblems                 int // polling reads that did not chain
	AnsweredTwice               int // texts in more than one reply: a submission run twice
	OverlappingTurns            int // turns of one session whose records interleave
	CompletedNoReply            int // completed, yet no reply contains its text
	StatusMismatch              int // the status route disagrees with the settlement record
	BadAnsweredBy               int // answeredBySubmissionId naming no completed-alike primary
	Orphans                     int // user entries of this run with no 202 and no abandoned request
	Misfiled                    int // a user entry whose text or session is not the admitted one
	Abandoned                   int // requests left unanswered at the end
	ClientErrors                int // 4xx answers to deliveries
	Rewinds, Resets             int // lifecycle changes acknowledged
	ChangeErrors                int // changes refused or answered wrongly
	RewindsUnseen               int // acknowledged rewinds not in the stream as answered
	ResetsUnaccounted           int // resets that removed other than what was read before them

	Requests, NoAnswer, ServerErrors int
	Retried, RetriedWasAdmitted      int
	Readers, Reconnects              int
	Outcomes                         map[string]int
	Samples                          []string // details of the first problems
}

func (r *tortureReport) sample(format string, args ...any) {
	if len(r.Samples) < 20 {
		r.Samples = append(r.Samples, fmt.Sprintf(format, args...))
	}
}

// countLoad takes what the clients and readers counted.
func (r *tortureReport) countLoad(tally tortureTally, readers []*tortureReader) {
	r.Requests, r.NoAnswer, r.ServerErrors = tally.Requests, tally.NoAnswer, tally.ServerErrors
	r.ClientErrors, r.Abandoned = tally.ClientErrors, tally.Abandoned
	r.DupTexts = tally.SameTextTwice + tally.SameIDTwice
	for _, s := range tally.ErrorSamples {
		r.sample("client error: %s", s)
	}
	r.Readers, r.Reconnects = len(readers), 0
	for _, rd := range readers {
		rd.mu.Lock()
		r.Reconnects += rd.reconnects
		rd.mu.Unlock()
	}
}

// verify fills the report from what the run observed.
func (r *tortureReport) verify(in tortureVerifyInput) {
	r.Verified = true
	r.Admitted = len(in.Admissions)
	r.countLoad(in.Tally, in.Readers)
	abandoned := map[string]bool{}
	for _, s := range in.Tally.AbandonedText {
		abandoned[s] = true
	}

	type settled struct {
		n  int
		st record.Settlement
	}
	userBySub := map[string]int{}
	settlements := map[string]*settled{}
	entryIDs := map[string]int{}
	replies := map[string]int{} // text -> how many times a reply carried it
	// Every record of the run: the final logs, and what each reset removed
	// (read just before it).
	type sessionLog struct {
		name string
		l    *tortureSessionLog
	}
	var all []sessionLog
	for _, rs := range in.Resets {
		all = append(all, sessionLog{rs.Session, rs.Removed})
	}
	for _, name := range slices.Sorted(maps.Keys(in.Logs)) {
		all = append(all, sessionLog{name, in.Logs[name]})
	}
	for _, sl := range all {
		name, l := sl.name, sl.l
		r.LogProblems += len(l.Problems)
		for _, p := range l.Problems {
			r.sample("session %s: %s", name, p)
		}
		if a, b := tortureOverlap(l.Records); a != "" {
			r.OverlappingTurns++
			r.sample("session %s: turns %s and %s overlap", name, a, b)
		}
		for _, rec := range l.Records {
			if rec.Kind != record.KindEntry || rec.Entry == nil {
				continue
			}
			e := rec.Entry
			entryIDs[e.ID]++
			switch e.Type {
			case record.EntryUserMessage:
				userBySub[e.SubmissionID]++
				text := tortureMessageText(e.Payload)
				a := in.Admissions[e.SubmissionID]
				switch {
				case a == nil && !abandoned[text]:
					r.Orphans++
					r.sample("user entry %s (%q, submission %s) in session %s: no 202 was received for it", e.ID, text, e.SubmissionID, name)
				case a != nil && (a.Text != text || a.Session != name):
					r.Misfiled++
					r.sample("submission %s was %q to %s; its entry holds %q in %s", e.SubmissionID, a.Text, a.Session, text, name)
				}
			case record.EntrySettlement:
				var st record.Settlement
				_ = json.Unmarshal(e.Payload, &st)
				s := settlements[e.SubmissionID]
				if s == nil {
					s = &settled{st: st}
					settlements[e.SubmissionID] = s
				}
				s.n++
			case record.EntryAssistantMessage:
				for _, line := range strings.Split(tortureMessageText(e.Payload), "\n\n") {
					if line = strings.TrimSpace(line); line != "" {
						replies[line]++
					}
				}
			}
		}
	}
	for id, n := range entryIDs {
		if n > 1 {
			r.DupEntryIDs += n - 1
			r.sample("entry id %s appears %d times", id, n)
		}
	}

	r.Outcomes = map[string]int{}
	stuckSessions := map[string]bool{}
	for _, id := range slices.Sorted(maps.Keys(in.Admissions)) {
		a := in.Admissions[id]
		switch n := userBySub[id]; {
		case n == 0:
			r.sample("submission %s (%q to %s, 202 at offset %q) has no user entry", id, a.Text, a.Session, a.Offset)
		case n > 1:
			r.DupUserEntries += n - 1
			r.sample("submission %s (%q) has %d user entries", id, a.Text, n)
		}
		if userBySub[id] > 0 {
			r.Found++
		}
		s := settlements[id]
		switch {
		case s == nil:
			r.Unsettled0++
			r.sample("submission %s (%q in %s) has no settlement record", id, a.Text, a.Session)
		case s.n > 1:
			r.UnsettledMany++
			r.sample("submission %s (%q in %s) has %d settlement records", id, a.Text, a.Session, s.n)
		}
		status, ok := in.Statuses[id]
		if !ok || !status.Status.Terminal() {
			r.StuckRunning++
			stuckSessions[a.Session] = true
			r.sample("submission %s (%q in %s) is %q at the end", id, a.Text, a.Session, status.Status)
		}
		if s != nil {
			r.Outcomes[tortureOutcomeName(s.st)]++
			if ok && status.Status.Terminal() && (string(status.Status) != string(s.st.Outcome) || tortureFailureCode(status.Error) != tortureFailureCode(s.st.Error)) {
				r.StatusMismatch++
				r.sample("submission %s: status %s/%s, settlement record %s/%s", id, status.Status, tortureFailureCode(status.Error), s.st.Outcome, tortureFailureCode(s.st.Error))
			}
			if p := s.st.AnsweredBySubmissionID; p != "" {
				ps := settlements[p]
				if in.Admissions[p] == nil || in.Admissions[p].Session != a.Session || ps == nil || ps.st.Outcome != s.st.Outcome {
					r.BadAnsweredBy++
					r.sample("submission %s answered by %s, which is not a primary of the same session and outcome", id, p)
				}
			}
			if s.st.Outcome == record.OutcomeCompleted && replies[a.Text] == 0 {
				r.CompletedNoReply++
				r.sample("submission %s (%q) completed, but no reply carries its text", id, a.Text)
			}
		}
		if replies[a.Text] > 1 {
			r.AnsweredTwice++
			r.sample("%q (submission %s) is in %d replies: run more than once", a.Text, id, replies[a.Text])
		}
		if a.Unanswered > 0 {
			r.Retried++
			if ok && status.AdmittedAt.Before(a.LastSent) {
				r.RetriedWasAdmitted++
			}
		}
	}
	r.verifyChanges(in)
	r.Missing = r.Admitted - r.Found
	r.Duplicates = r.DupUserEntries + r.DupTexts + r.DupEntryIDs
	r.Unsettled = r.Unsettled0 + r.UnsettledMany
	r.StuckSessions = len(stuckSessions)

	for _, rd := range in.Readers {
		rd.mu.Lock()
		if rd.nproblems > 0 || len(rd.problems) > 0 || rd.failed {
			r.GapReaders++
			for _, p := range rd.problems {
				r.sample("reader %d (%s): %s", rd.id, rd.session, p)
			}
		}
		if l := in.Logs[rd.session]; l != nil && (rd.inc != l.Incarnation && len(rd.frames) > 0 || !tortureSameBatches(rd.frames, l.Batches)) {
			r.ReaderMismatch++
			r.sample("reader %d (%s) saw %d frames ending at %q; the log has %d batches ending at %q", rd.id, rd.session, len(rd.frames), rd.expected, len(l.Batches), l.Next)
		}
		// An incarnation a reset ended: what the reader saw of it is the
		// start of what the reset removed (the whole, unless the reader
		// was away when it happened).
		for _, seg := range rd.past {
			if seg.Incarnation == "" && len(seg.Frames) == 0 {
				continue // nothing seen before the first reset
			}
			var removed *tortureSessionLog
			for _, rs := range in.Resets {
				if rs.Session == rd.session && rs.Removed.Incarnation == seg.Incarnation {
					removed = rs.Removed
				}
			}
			if removed == nil || len(seg.Frames) > len(removed.Batches) || !tortureSameBatches(seg.Frames, removed.Batches[:len(seg.Frames)]) {
				r.ReaderMismatch++
				r.sample("reader %d (%s) saw %d frames of incarnation %s, which no reset's read matches", rd.id, rd.session, len(seg.Frames), seg.Incarnation)
			}
		}
		rd.mu.Unlock()
	}
}

func tortureSameBatches(a, b []tortureBatch) bool {
	return slices.EqualFunc(a, b, func(x, y tortureBatch) bool {
		return x.Offset == y.Offset && x.Next == y.Next && slices.Equal(x.IDs, y.IDs)
	})
}

// tortureMessageText is the text of a message payload's text parts.
func tortureMessageText(payload json.RawMessage) string {
	var m record.MessagePayload
	if json.Unmarshal(payload, &m) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range m.Parts {
		if p.Type == record.PartText {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

func tortureFailureCode(f *record.Failure) string {
	if f == nil {
		return ""
	}
	return f.Code
}

func tortureOutcomeName(st record.Settlement) string {
	s := string(st.Outcome)
	if c := tortureFailureCode(st.Error); c != "" && c != string(st.Outcome) {
		s += " " + c
	}
	if st.AnsweredBySubmissionID != "" {
		s += ", answered by another"
	}
	return s
}

// zeroChecks are the counts that must be 0, in table order.
func (r *tortureReport) zeroChecks() []struct {
	name string
	n    int
} {
	return []struct {
		name string
		n    int
	}{
		{"missing (admitted - found)", r.Missing},
		{"duplicates", r.Duplicates},
		{"unsettled (not exactly 1 settlement)", r.Unsettled},
		{"stuck running (not terminal at the end)", r.StuckRunning},
		{"readers that saw a gap", r.GapReaders},
		{"readers whose frames differ from the log", r.ReaderMismatch},
		{"polled reads that did not chain", r.LogProblems},
		{"submissions run twice", r.AnsweredTwice},
		{"sessions with overlapping turns", r.OverlappingTurns},
		{"completed without a reply", r.CompletedNoReply},
		{"status route ≠ settlement record", r.StatusMismatch},
		{"bad answeredBySubmissionId", r.BadAnsweredBy},
		{"user entries without a 202", r.Orphans},
		{"user entries with another text/session", r.Misfiled},
		{"requests abandoned unanswered", r.Abandoned},
		{"4xx answers to deliveries", r.ClientErrors},
		{"lifecycle changes refused or answered wrongly", r.ChangeErrors},
		{"rewinds not in the stream as answered", r.RewindsUnseen},
		{"resets that removed unread records", r.ResetsUnaccounted},
		{"service exits the torture did not cause", r.UnexpectedExits},
		{"final SIGTERM stop failed", r.FinalStopFailed},
	}
}

// Problems lists every check that failed; empty means the run passed.
func (r *tortureReport) Problems() []string {
	var p []string
	if !r.Verified {
		p = append(p, "the run did not reach verification")
	}
	if r.Verified && r.Admitted == 0 {
		p = append(p, "nothing was admitted")
	}
	if r.Verified && r.Found != r.Admitted {
		p = append(p, fmt.Sprintf("entries found %d ≠ admitted %d", r.Found, r.Admitted))
	}
	for _, c := range r.zeroChecks() {
		if c.n != 0 {
			p = append(p, fmt.Sprintf("%s: %d", c.name, c.n))
		}
	}
	return p
}

// Table renders the report.
func (r *tortureReport) Table() string {
	var b strings.Builder
	verdict := "PASS"
	if len(r.Problems()) > 0 {
		verdict = "FAIL"
	}
	c := r.Config
	fmt.Fprintf(&b, "convlog torture: %s — %d kill cycles (SIGKILL), %d clients, %d sessions, %d SSE readers, NATS %s\n",
		verdict, r.Cycles, c.Clients, c.Sessions, r.Readers, r.Broker)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, n int, want string) {
		mark := ""
		if want == "0" && n != 0 {
			mark = "  <-- FAIL"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\n", name, n, want, mark)
	}
	fmt.Fprintf(tw, "  check\tcount\tmust be\t\n")
	row("admitted (202s, distinct submissions)", r.Admitted, "> 0")
	row("entries found", r.Found, "admitted")
	for _, ch := range r.zeroChecks() {
		row(ch.name, ch.n, "0")
	}
	tw.Flush()
	if r.Duplicates > 0 {
		fmt.Fprintf(&b, "  duplicates: %d user entries, %d text/submission pairings, %d entry ids\n", r.DupUserEntries, r.DupTexts, r.DupEntryIDs)
	}
	if r.Unsettled > 0 {
		fmt.Fprintf(&b, "  unsettled: %d without a settlement, %d with several\n", r.Unsettled0, r.UnsettledMany)
	}
	if r.StuckRunning > 0 {
		fmt.Fprintf(&b, "  stuck: %d submissions in %d sessions\n", r.StuckRunning, r.StuckSessions)
	}
	fmt.Fprintf(&b, "  outcomes:")
	for _, k := range slices.Sorted(maps.Keys(r.Outcomes)) {
		fmt.Fprintf(&b, " %s %d;", k, r.Outcomes[k])
	}
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "  requests: %d sent, %d got no answer (service down or killed), %d 5xx; %d deliveries retried after a lost answer, %d of them already admitted (idempotent replay)\n",
		r.Requests, r.NoAnswer, r.ServerErrors, r.Retried, r.RetriedWasAdmitted)
	fmt.Fprintf(&b, "  readers: %d SSE reconnects with Last-Event-ID\n", r.Reconnects)
	fmt.Fprintf(&b, "  changes: %d rewinds, %d resets (their removed records read first and counted)\n", r.Rewinds, r.Resets)
	if r.WorkerKills > 0 {
		fmt.Fprintf(&b, "  cluster: %d workers and %d stream leaders SIGKILLed and restarted; %d probes not completed\n", r.WorkerKills, r.BrokerKills, r.ProbeFailures)
		fmt.Fprintf(&b, "  stall per kill: %s\n", stallSummary(r.Stalls))
		for i, st := range r.Stalls {
			fmt.Fprintf(&b, "    cycle %d: leader %s, answered %s\n", i+1, st.Election.Round(time.Millisecond), st.Answered.Round(time.Millisecond))
		}
	} else if r.BrokerKills > 0 || r.BrokerLiveKills > 0 {
		fmt.Fprintf(&b, "  broker: %d SIGKILLs and restarts with the service, %d while the service ran\n", r.BrokerKills, r.BrokerLiveKills)
	}
	fmt.Fprintf(&b, "  service started %d times", r.ServiceStarts)
	if r.BrokerStarts > 0 {
		fmt.Fprintf(&b, ", broker %d times", r.BrokerStarts)
	}
	fmt.Fprintln(&b)
	if r.FinalStop != "" {
		fmt.Fprintf(&b, "  final stop: %s\n", r.FinalStop)
	}
	rate := 0.0
	if r.LoadDuration > 0 {
		rate = float64(r.Admitted) / r.LoadDuration.Seconds()
	}
	fmt.Fprintf(&b, "  duration: %s (load %s, %.0f admissions/s), seed %d\n",
		r.Duration.Round(time.Millisecond), r.LoadDuration.Round(time.Millisecond), rate, c.Seed)
	if r.Dir != "" {
		fmt.Fprintf(&b, "  working folder: %s\n", r.Dir)
	}
	for i, n := range r.ExitNotes {
		if i == 3 {
			fmt.Fprintf(&b, "  ... and %d more unexpected exits (service.log has them all)\n", len(r.ExitNotes)-i)
			break
		}
		fmt.Fprintf(&b, "  unexpected exit: %s\n", n)
	}
	for _, s := range r.Samples {
		fmt.Fprintf(&b, "  ! %s\n", s)
	}
	return strings.TrimRight(b.String(), "\n")
}

// tortureOverlap finds two turns of one session whose records interleave
// (a record of one between two of the other): two turns run at once. A
// turn's records are its reply pieces, tool results and settlements, by
// their turnId; one turn at a time means each turn's records are one run.
func tortureOverlap(recs []record.Record) (string, string) {
	done := map[string]bool{} // turns followed by another's record
	cur := ""
	for _, rec := range recs {
		if rec.Kind != record.KindEntry || rec.Entry == nil || rec.Entry.TurnID == "" {
			continue
		}
		id := rec.Entry.TurnID
		if id == cur {
			continue
		}
		if done[id] {
			return id, cur
		}
		if cur != "" {
			done[cur] = true
		}
		cur = id
	}
	return "", ""
}
