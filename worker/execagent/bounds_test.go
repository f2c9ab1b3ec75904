package execagent_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agentwire"
	"github.com/convlog/convlog/worker/execagent"
)

// waitGone polls until pid is no more (or fails the test).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	check.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("process %d still alive", pid)
		}
		return nil
	})
}

// A program that exits without a terminal event fails its turn when it
// exits, though a child it left in the background holds its output; the
// child goes with it (it held the turn until it ended: an hour with
// "sleep 3600 &"). A child that left the group holds it no longer than
// the grace period.
func TestExitLeavingABackgroundChild(t *testing.T) {
	for _, tc := range []struct {
		name       string
		newSession bool
	}{
		{"in the group", false},
		{"left the group", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pid")
			a := script(t, `import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=`+map[bool]string{true: "True", false: "False"}[tc.newSession]+`)
open(`+strconv.Quote(pidFile)+`, "w").write(str(child.pid))
print('{"type":"text","delta":"a"}', flush=True)
sys.exit(0)
`)
			a.Grace = 300 * time.Millisecond
			evs, err := collectWithin(a, 20*time.Second)
			b, rerr := os.ReadFile(pidFile)
			if rerr != nil {
				t.Fatal(rerr)
			}
			pid, _ := strconv.Atoi(string(b))
			if tc.newSession {
				t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			}
			if err != nil {
				t.Fatal(err)
			}
			l := evs[len(evs)-1]
			if l.Type != worker.EventFailed || l.Code != agentwire.CodeAgentProtocol || !strings.Contains(l.Details, "without a completed or failed event") {
				t.Fatalf("last event %+v", l)
			}
			if !tc.newSession {
				waitGone(t, pid)
			}
		})
	}
}

func collectWithin(a *execagent.Agent, bound time.Duration) ([]worker.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var evs []worker.Event
	for ev := range a.Invoke(ctx, worker.Scope{Session: "a/i/s", TurnID: "turn_1"}, worker.Prompt{Text: "x"}) {
		evs = append(evs, ev)
	}
	if ctx.Err() != nil {
		return evs, context.Cause(ctx)
	}
	return evs, nil
}

// A program flooding stderr puts a bounded number of lines in the log,
// each cut to StderrLineMax, and the log says what was dropped (3 s of
// "yes >&2" grew the log by 395 MB).
func TestStderrIsRateLimited(t *testing.T) {
	const flood = 200000
	a := script(t, `import sys
sys.stderr.write("x" * 10000 + "\n")
for i in range(`+strconv.Itoa(flood)+`):
    sys.stderr.write("y\n")
sys.stderr.flush()
print('{"type":"completed"}', flush=True)
`)
	var logs syncBuf
	a.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	ev := last(t, a)
	if ev.Type != worker.EventCompleted {
		t.Fatalf("%+v", ev)
	}
	out := logs.String()
	lines := strings.Count(out, `msg="agent stderr"`)
	// The burst, and the rate for however long the flood took.
	if lines < 2 || lines > execagent.StderrBurst+10*execagent.StderrRate {
		t.Fatalf("%d stderr lines logged of %d", lines, flood+1)
	}
	if !strings.Contains(out, "truncated_bytes="+strconv.Itoa(10000-execagent.StderrLineMax)) {
		t.Fatal("the long line was not cut, or not said to be")
	}
	if !strings.Contains(out, "lines dropped (rate limit)") {
		t.Fatal("the log does not say what was dropped")
	}
	if len(out) > 1<<20 {
		t.Fatalf("the log grew by %d bytes", len(out))
	}
}
