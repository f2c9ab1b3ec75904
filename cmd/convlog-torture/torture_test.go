package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/testbin"
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// The short torture runs in every `go test`: the real binary, built here,
// SIGKILLed 3 times under 8 posting clients and 4 SSE readers. `make
// torture` runs the long one (docs/torture.md).
func TestTorture(t *testing.T) {
	runTortureTest(t, tortureConfig{Cycles: 3, Clients: 8, Sessions: 4, KillEvery: 2 * time.Second})
}

// With access control on: every request carries a token, nothing changes.
func TestTortureWithAuth(t *testing.T) {
	runTortureTest(t, tortureConfig{Cycles: 2, Clients: 4, Sessions: 3, KillEvery: 2 * time.Second, Auth: true})
}

// The same with an external broker that the torture runs itself and
// SIGKILLs and restarts with the service. With CI set, a missing
// nats-server is a failure.
func TestTortureNATSRestart(t *testing.T) {
	if _, err := tortureLookNATSServer("nats-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and nats-server is missing: %v", err)
		}
		t.Skipf("no nats-server (install it, or set CI to make this a failure): %v", err)
	}
	runTortureTest(t, tortureConfig{Cycles: 3, Clients: 8, Sessions: 4, KillEvery: 2 * time.Second, NATSRestart: true})
}

// One hot session: 16 clients post to a single session, so submissions
// queue behind each running turn and the next turn answers them all. It
// was the reproduction of a turn answering more than 1,024 submissions,
// which could never settle (docs/torture.md, "Findings"); turns now answer
// at most 256 and orphans settle in chunks.
func TestTortureHotSession(t *testing.T) {
	// One session, posted to faster than its turns answer: the backlog
	// passes 1,024 (a turn's echo of 256 one-word messages takes ~1.3 s).
	runTortureTest(t, tortureConfig{Cycles: 2, Clients: 4, Sessions: 1, KillEvery: 3 * time.Second,
		EchoDelay: 5 * time.Millisecond, SettleTimeout: 90 * time.Second})
}

// The service restarted while its external broker is down (for 7s, longer
// than JetStream's 5s request timeout) must keep admitting and wait for
// the broker. It reproduces the exit of `serve` when its first JetStream
// request timed out (docs/torture.md, "Findings"); the pool now waits for
// the broker instead.
func TestTortureBrokerDownAtStart(t *testing.T) {
	if _, err := tortureLookNATSServer("nats-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and nats-server is missing: %v", err)
		}
		t.Skipf("nats-server: %v (set CI to make this a failure)", err)
	}
	runTortureTest(t, tortureConfig{Cycles: 1, Clients: 4, Sessions: 4, KillEvery: 2 * time.Second,
		NATSRestart: true, NATSDown: 7 * time.Second})
}

// The cluster torture, short: 3 nats-server nodes built from the module
// the project requires (Debian's is too old for sync_interval), serve
// --workers=0, 2 convlog workers; each cycle SIGKILLs a worker and the node
// leading the submissions stream. `make torture-cluster` runs 10 cycles.
func TestTortureCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the real binaries and kills them under load; skipped with -short")
	}
	// 3 clients: remote turns answer fewer messages a second than admission
	// takes, and a larger backlog only lengthens the final settling.
	runTortureTest(t, tortureConfig{Cycles: 3, Clients: 3, Sessions: 4, KillEvery: 2 * time.Second,
		Cluster: true, NATSServer: buildNATSServer(t)})
}

// buildNATSServer builds nats-server from the Go module the project
// requires, once per run. Under CI, failing to is a failure; otherwise the
// test skips.
func buildNATSServer(t *testing.T) string {
	t.Helper()
	out, err := testbin.Build("github.com/nats-io/nats-server/v2", "nats-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and nats-server cannot be built: %v", err)
		}
		t.Skipf("cannot build nats-server (set CI to make this a failure): %v", err)
	}
	return out
}

func runTortureTest(t *testing.T, cfg tortureConfig) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the real binary and kills it under load; skipped with -short")
	}
	cfg.Bin = buildConvlog(t)
	cfg.Data = t.TempDir()
	cfg.Log = testLogWriter{t}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := runTorture(ctx, cfg)
	if rep != nil {
		t.Log("\n" + rep.Table())
	}
	if err != nil {
		t.Errorf("torture: %v", err)
	}
	if rep != nil {
		if p := rep.Problems(); len(p) > 0 {
			t.Errorf("torture found: %s", strings.Join(p, "; "))
		}
		if rep.Cycles != cfg.Cycles {
			t.Errorf("%d kill cycles, want %d", rep.Cycles, cfg.Cycles)
		}
	}
	if t.Failed() {
		t.Logf("service log tail:\n%s", tortureTail(filepath.Join(cfg.Data, "service.log"), 60))
		if cfg.Cluster {
			for i := range clusterWorkers {
				t.Logf("worker-%d log tail:\n%s", i+1, tortureTail(filepath.Join(cfg.Data, fmt.Sprintf("worker-%d.log", i+1)), 30))
			}
		}
	}
}

// buildConvlog builds the binary under test, once per run.
func buildConvlog(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the torture test builds the real binary and needs the go command: %v", err)
	}
	start := time.Now()
	out, err := testbin.Build("github.com/convlog/convlog/cmd/convlog", "convlog")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s, built or waited for in %s", out, time.Since(start).Round(time.Millisecond))
	return out
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// The verification must see what it exists to see: feed it a log with one
// of each fault and check each count.
func TestTortureVerifyFindsFaults(t *testing.T) {
	t.Parallel()
	entry := func(id, typ, sub string, payload any) record.Record {
		b, _ := json.Marshal(payload)
		return record.EntryRecord(record.Entry{ID: id, Type: typ, SubmissionID: sub, Payload: b})
	}
	user := func(id, sub, text string) record.Record {
		return entry(id, record.EntryUserMessage, sub, record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	}
	reply := func(id, sub, text string) record.Record {
		return entry(id, record.EntryAssistantMessage, sub, record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	}
	settle := func(id, sub string, o record.Outcome, by string) record.Record {
		return entry(id, record.EntrySettlement, sub, record.Settlement{SubmissionID: sub, Outcome: o, AnsweredBySubmissionID: by})
	}
	adm := func(sub, text string) *tortureAdmission {
		return &tortureAdmission{SubmissionID: sub, Text: text, Session: "s0"}
	}
	done := func(o record.Status) record.Submission { return record.Submission{Status: o} }
	in := tortureVerifyInput{
		Admissions: map[string]*tortureAdmission{
			"ok1": adm("ok1", "c0-0"), "ok2": adm("ok2", "c0-1"), // one turn, ok2 answered by ok1
			"lost":    adm("lost", "c0-2"),    // no user entry
			"twice":   adm("twice", "c0-3"),   // two user entries
			"settle2": adm("settle2", "c0-4"), // two settlements
			"open":    adm("open", "c0-5"),    // no settlement, still running
			"rerun":   adm("rerun", "c0-6"),   // in two replies
		},
		Statuses: map[string]record.Submission{
			"ok1": done(record.StatusCompleted), "ok2": done(record.StatusCompleted), "lost": done(record.StatusCompleted),
			"twice": done(record.StatusCompleted), "settle2": done(record.StatusCompleted),
			"open": done(record.StatusRunning), "rerun": done(record.StatusFailed),
		},
		Logs: map[string]*tortureSessionLog{"s0": {Session: "s0", Batches: []tortureBatch{{Offset: "0", Next: "21"}}, Records: []record.Record{
			user("e1", "ok1", "c0-0"), user("e2", "ok2", "c0-1"),
			reply("e3", "ok1", "c0-0\n\nc0-1"),
			settle("e4", "ok1", record.OutcomeCompleted, ""), settle("e5", "ok2", record.OutcomeCompleted, "ok1"),
			settle("e6", "lost", record.OutcomeCompleted, ""),
			user("e7", "twice", "c0-3"), user("e8", "twice", "c0-3"), reply("e9", "twice", "c0-3"),
			settle("e10", "twice", record.OutcomeCompleted, ""),
			user("e11", "settle2", "c0-4"), reply("e12", "settle2", "c0-4"),
			settle("e13", "settle2", record.OutcomeCompleted, ""), settle("e14", "settle2", record.OutcomeCompleted, ""),
			user("e15", "open", "c0-5"),
			user("e16", "rerun", "c0-6"), reply("e17", "rerun", "c0-6"), reply("e18", "rerun", "c0-6"),
			settle("e19", "rerun", record.OutcomeFailed, ""),
			user("e20", "ghost", "c9-9"), // no 202 for it
			user("e1", "ghost2", "c9-8"), // a repeated entry id, no 202 either
		}}},
		Readers: []*tortureReader{{session: "s0", problems: []string{"frame at offset \"5\" when \"3\" was due"}}},
		Tally:   tortureTally{SameTextTwice: 1},
	}
	var r tortureReport
	r.verify(in)
	got := map[string]int{
		"admitted": r.Admitted, "found": r.Found, "missing": r.Missing,
		"dup user entries": r.DupUserEntries, "dup texts": r.DupTexts, "dup entry ids": r.DupEntryIDs,
		"no settlement": r.Unsettled0, "several settlements": r.UnsettledMany, "stuck": r.StuckRunning,
		"gap readers": r.GapReaders, "reader mismatch": r.ReaderMismatch, "run twice": r.AnsweredTwice,
		"orphans": r.Orphans, "status mismatch": r.StatusMismatch, "completed no reply": r.CompletedNoReply,
	}
	want := map[string]int{
		"admitted": 7, "found": 6, "missing": 1,
		"dup user entries": 1, "dup texts": 1, "dup entry ids": 1,
		"no settlement": 1, "several settlements": 1, "stuck": 1,
		"gap readers": 1, "reader mismatch": 1, "run twice": 1,
		"orphans": 2, "status mismatch": 0, "completed no reply": 1, // "lost" completed with no reply
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %d, want %d", k, got[k], w)
		}
	}
	if len(r.Problems()) == 0 {
		t.Fatal("no problems reported")
	}
	t.Log("\n" + r.Table())

	// And a clean log passes.
	clean := tortureVerifyInput{
		Admissions: map[string]*tortureAdmission{"ok1": adm("ok1", "c0-0")},
		Statuses:   map[string]record.Submission{"ok1": done(record.StatusCompleted)},
		Logs: map[string]*tortureSessionLog{"s0": {Session: "s0", Records: []record.Record{
			user("e1", "ok1", "c0-0"), reply("e2", "ok1", "c0-0"), settle("e3", "ok1", record.OutcomeCompleted, ""),
		}}},
	}
	var c tortureReport
	c.verify(clean)
	if p := c.Problems(); len(p) > 0 {
		t.Fatalf("clean log: %v", p)
	}
}

// The verification of lifecycle changes: a submission whose records a
// reset removed is found in the read made before the reset, not missing;
// a rewind must be in the stream as answered; a reset must remove only
// what was read before it.
func TestTortureVerifyChanges(t *testing.T) {
	t.Parallel()
	user := func(id, parent, sub, text string) record.Record {
		b, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
		return record.EntryRecord(record.Entry{ID: id, ParentID: parent, Type: record.EntryUserMessage, SubmissionID: sub, Payload: b})
	}
	reply := func(id, parent, sub, text string) record.Record {
		b, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
		return record.EntryRecord(record.Entry{ID: id, ParentID: parent, Type: record.EntryAssistantMessage, SubmissionID: sub, Payload: b})
	}
	settle := func(id, parent, sub string, o record.Outcome) record.Record {
		b, _ := json.Marshal(record.Settlement{SubmissionID: sub, Outcome: o})
		return record.EntryRecord(record.Entry{ID: id, ParentID: parent, Type: record.EntrySettlement, SubmissionID: sub, Payload: b})
	}
	sessionLog := func(inc record.Incarnation, batches ...[]record.Record) *tortureSessionLog {
		l := &tortureSessionLog{Session: "s0", Incarnation: inc}
		for i, b := range batches {
			l.Batches = append(l.Batches, tortureBatch{Offset: record.Offset(fmt.Sprint(i)), Next: record.Offset(fmt.Sprint(i + 1)), IDs: tortureBatchIDs(b)})
			l.BatchRecords = append(l.BatchRecords, b)
			l.Records = append(l.Records, b...)
		}
		l.Next = record.Offset(fmt.Sprint(len(batches)))
		return l
	}
	input := func() tortureVerifyInput {
		// Incarnation A: "a" answered, "b" answered, then rewound to
		// before "b"; then reset. Incarnation B: "c" answered.
		removed := sessionLog("inc_A",
			[]record.Record{user("e1", "", "sa", "a")},
			[]record.Record{reply("e2", "e1", "sa", "a"), settle("e3", "e2", "sa", record.OutcomeCompleted)},
			[]record.Record{user("e4", "e3", "sb", "b")},
			[]record.Record{reply("e5", "e4", "sb", "b"), settle("e6", "e5", "sb", record.OutcomeCompleted)},
			[]record.Record{record.TruncatedRecord("e3", clog.ReasonRewind)},
		)
		final := sessionLog("inc_B",
			[]record.Record{user("f1", "", "sc", "c")},
			[]record.Record{reply("f2", "f1", "sc", "c"), settle("f3", "f2", "sc", record.OutcomeCompleted)},
		)
		adm := func(sub, text string) *tortureAdmission {
			return &tortureAdmission{SubmissionID: sub, Text: text, Session: "s0"}
		}
		done := record.Submission{Status: record.StatusCompleted}
		return tortureVerifyInput{
			Admissions: map[string]*tortureAdmission{"sa": adm("sa", "a"), "sb": adm("sb", "b"), "sc": adm("sc", "c")},
			Statuses:   map[string]record.Submission{"sa": done, "sb": done, "sc": done},
			Logs:       map[string]*tortureSessionLog{"s0": final},
			Rewinds:    []tortureRewind{{Session: "s0", EntryID: "e4", Incarnation: "inc_A", Offset: "4", LeafID: "e3"}},
			Resets:     []tortureReset{{Session: "s0", Removed: removed, Previous: "inc_A", Tail: "5", New: "inc_B"}},
			Readers: []*tortureReader{{session: "s0", inc: "inc_B", frames: final.Batches, expected: final.Next,
				past: []tortureSegment{{Incarnation: "inc_A", Frames: removed.Batches[:3]}}}},
		}
	}
	var clean tortureReport
	clean.verify(input())
	if p := clean.Problems(); len(p) > 0 || clean.Found != 3 || clean.Rewinds != 1 || clean.Resets != 1 {
		t.Fatalf("clean run: found %d, %v\n%s", clean.Found, p, clean.Table())
	}
	for name, c := range map[string]struct {
		mutate func(*tortureVerifyInput)
		count  func(*tortureReport) int
	}{
		"rewind to the wrong offset": {func(in *tortureVerifyInput) { in.Rewinds[0].Offset = "3" }, func(r *tortureReport) int { return r.RewindsUnseen }},
		"rewind target still on the path": {func(in *tortureVerifyInput) {
			in.Rewinds = append(in.Rewinds, tortureRewind{Session: "s0", EntryID: "f1", Incarnation: "inc_B", Offset: "1", LeafID: ""})
		}, func(r *tortureReport) int { return r.RewindsUnseen }},
		"reset removed more than was read": {func(in *tortureVerifyInput) { in.Resets[0].Tail = "7" }, func(r *tortureReport) int { return r.ResetsUnaccounted }},
		"reader saw another past":          {func(in *tortureVerifyInput) { in.Readers[0].past[0].Incarnation = "inc_X" }, func(r *tortureReport) int { return r.ReaderMismatch }},
		"a change refused":                 {func(in *tortureVerifyInput) { in.ChangeProblems = []string{"rewind: 409"} }, func(r *tortureReport) int { return r.ChangeErrors }},
	} {
		in := input()
		c.mutate(&in)
		var r tortureReport
		r.verify(in)
		if c.count(&r) != 1 || len(r.Problems()) == 0 {
			t.Errorf("%s: count %d, problems %v", name, c.count(&r), r.Problems())
		}
	}
}
