package jsclient_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/testbin"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

// lookNode finds node, or skips; under CI a missing node is a failure,
// because then the JS client would go untested without anyone noticing.
func lookNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node is required under CI: %v", err)
		}
		t.Skipf("node not found (%v): the JS client's tests need Node 20+", err)
	}
	return node
}

// goBuild builds a package of this module, once per run.
func goBuild(t *testing.T, pkg, name string) string {
	t.Helper()
	out, err := testbin.Build(pkg, name)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNode runs the JS client's tests (node --test) against the real
// convlog binary, built here, and logtool for the offline reset and rewind.
func TestNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the real binary and kills it; skipped with -short")
	}
	node := lookNode(t)
	convlog := goBuild(t, "github.com/convlog/convlog/cmd/convlog", "convlog")
	logtool := goBuild(t, "github.com/convlog/convlog/transport/jsclient/testdata/logtool", "logtool")
	files, err := filepath.Glob("test/*.test.js")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	cmd := exec.Command(node, append([]string{"--test", "--test-reporter=tap", "--test-timeout=180000"}, files...)...)
	cmd.Env = append(os.Environ(), "CONVLOG_BIN="+convlog, "CONVLOG_LOGTOOL="+logtool)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node --test:\n%s", out.String())
	if err != nil {
		t.Fatalf("node --test failed: %v", err)
	}
}

// TestProjectionMatchesGo checks the JS projection against the Go package
// on random conversations: branches, truncations (to known and unknown
// entries), tool calls and results, repeated settlements, odd payloads,
// unknown entry and part types. (Unknown record kinds do not survive Go's
// decoding; test/projection.test.js covers them.)
func TestProjectionMatchesGo(t *testing.T) {
	t.Parallel()
	node := lookNode(t)
	rng := rand.New(rand.NewPCG(13, 7))
	type testCase struct {
		Records []record.Record `json:"records"`
		View    projection.View `json:"view"`
	}
	var cases []testCase
	for range 400 {
		records := randomConversation(rng)
		cases = append(cases, testCase{records, projection.Project(records)})
	}
	b, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "cases.json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(node, "test/crosscheck.js", file).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the JS projection differs from Go's: %v", err)
	}
}

func randomConversation(rng *rand.Rand) []record.Record {
	var records []record.Record
	var ids []string
	pick := func() string {
		if len(ids) == 0 || rng.IntN(8) == 0 {
			return fmt.Sprintf("never-%d", rng.IntN(3))
		}
		return ids[rng.IntN(len(ids))]
	}
	call := func() string { return fmt.Sprintf("c%d", rng.IntN(5)) }
	str := func(s ...string) string { return s[rng.IntN(len(s))] }
	message := func() json.RawMessage {
		var p record.MessagePayload
		p.Purpose = str("", "user", "assistant", "dispatch", "advisory", "future")
		p.Display = str("", "visible", "hidden", "diagnostic")
		if rng.IntN(4) == 0 {
			p.Metadata = json.RawMessage(str(`{"a":1}`, `null`, `{"nested":{"x":[1,2]}}`))
		}
		for range rng.IntN(4) {
			switch str("text", "reasoning", "tool-call", "tool-call", "file", "data", "sparkle") {
			case "tool-call":
				p.Parts = append(p.Parts, record.Part{Type: "tool-call", ToolCallID: call(), ToolName: str("", "search", "fetch"), Input: json.RawMessage(str(``, `{"q":"x"}`, `null`, `[1]`))})
			case "file":
				p.Parts = append(p.Parts, record.Part{Type: "file", MediaType: "text/plain", URL: "data:,x", Filename: str("", "f.txt")})
			case "data":
				p.Parts = append(p.Parts, record.Part{Type: "data", Name: str("", "d"), Data: json.RawMessage(str(``, `{"k":true}`, `"s"`))})
			case "sparkle":
				p.Parts = append(p.Parts, record.Part{Type: "sparkle", Text: "?"})
			default:
				p.Parts = append(p.Parts, record.Part{Type: str("text", "reasoning"), Text: str("", "hi", "a longer text")})
			}
		}
		b, _ := json.Marshal(p)
		return b
	}
	for i := range rng.IntN(40) {
		id := fmt.Sprintf("e%d", i)
		if rng.IntN(20) == 0 && len(ids) > 0 {
			id = ids[rng.IntN(len(ids))] // a repeated id: skipped
		}
		parent := ""
		if len(ids) > 0 && rng.IntN(6) != 0 {
			parent = ids[len(ids)-1]
			if rng.IntN(4) == 0 {
				parent = pick()
			}
		}
		e := record.Entry{ID: id, ParentID: parent, Timestamp: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), SubmissionID: str("", "s1", "s2", "s3"), TurnID: str("", "t1")}
		switch rng.IntN(12) {
		case 0, 1, 2:
			e.Type, e.Payload = record.EntryUserMessage, message()
		case 3, 4, 5:
			e.Type, e.Payload = record.EntryAssistantMessage, message()
		case 6, 7:
			b, _ := json.Marshal(record.ToolResultPayload{ToolCallID: call(), ToolName: str("", "search"), IsError: rng.IntN(2) == 0, Output: json.RawMessage(str(``, `null`, `"boom"`, `{"x":1}`, `[1,2]`))})
			e.Type, e.Payload = record.EntryToolResult, b
		case 8:
			s := record.Settlement{SubmissionID: str("", "s1", "s2", "s3"), Outcome: record.Outcome(str("", "completed", "failed", "aborted")), AnsweredBySubmissionID: str("", "", "s1")}
			if rng.IntN(2) == 0 {
				s.Error = &record.Failure{Code: str("", "tool_error"), Message: "m", Retryable: rng.IntN(2) == 0}
			}
			b, _ := json.Marshal(s)
			e.Type, e.Payload = record.EntrySettlement, b
		case 9:
			e.Type = str("custom_note", record.EntryUserMessage, record.EntryToolResult, record.EntrySettlement)
			e.Payload = json.RawMessage(str(`{"custom":true}`, `[1]`, `"x"`, `{"parts":"no"}`, `null`, `{"parts":[{"type":"text","text":5}]}`, `{"outcome":7}`))
		case 10, 11:
			to := pick()
			if rng.IntN(5) == 0 {
				to = ""
			}
			r := record.TruncatedRecord(to, "test")
			if rng.IntN(4) == 0 {
				r.NewLeafID = pick()
			}
			records = append(records, r)
			continue
		}
		records = append(records, record.EntryRecord(e))
		ids = append(ids, id)
	}
	return records
}

// TestTypes compiles testdata/types/usage.ts, an application's use of the
// client, against the .d.ts files with tsc --strict (npm's typescript,
// installed from the lockfile when missing).
func TestTypes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("may install typescript with npm; skipped with -short")
	}
	node := lookNode(t)
	dir := filepath.Join("testdata", "types")
	tsc := filepath.Join(dir, "node_modules", "typescript", "bin", "tsc")
	if _, err := os.Stat(tsc); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("npm is required under CI: %v", err)
			}
			t.Skipf("npm not found (%v): cannot install typescript", err)
		}
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
	cmd := exec.Command(node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, out)
	}
}
