package execagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agenttest"
	"github.com/convlog/convlog/worker/agentwire"
	"github.com/convlog/convlog/worker/execagent"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPythonAgentConformance(t *testing.T) {
	a := &execagent.Agent{Command: []string{agenttest.Python(t), agenttest.ExampleAgent(t)}}
	long := worker.Prompt{Text: "slow " + strings.Repeat("word ", 200)}
	agenttest.Run(t, a, agenttest.Options{
		Prompt:     worker.Prompt{Text: "hello world"},
		Long:       &long,
		Unknown:    &worker.Prompt{Text: "hello"},
		UnknownRaw: json.RawMessage(`{"type":"x-progress","pct":50}`),
	})
	evs, err := agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/b/c"}, worker.Prompt{Text: "hi there"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; last.Type != worker.EventCompleted || string(last.Data) != `{"session": "a/b/c"}` {
		t.Fatalf("%+v", last)
	}
}

// script runs a Python program given inline.
func script(t *testing.T, code string) *execagent.Agent {
	t.Helper()
	f := filepath.Join(t.TempDir(), "agent.py")
	if err := os.WriteFile(f, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	return &execagent.Agent{Command: []string{agenttest.Python(t), f}, Grace: time.Second}
}

func last(t *testing.T, a *execagent.Agent) worker.Event {
	t.Helper()
	evs, err := agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/i/s", TurnID: "turn_1"}, worker.Prompt{Text: "x"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := agenttest.CheckTerminal(evs); err != nil {
		t.Fatal(err)
	}
	return evs[len(evs)-1]
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestFailures(t *testing.T) {
	t.Run("exit without terminal", func(t *testing.T) {
		a := script(t, "import sys\nprint('{\"type\":\"text\",\"delta\":\"a\"}')\nsys.stderr.write('oops\\n')\nsys.exit(3)\n")
		var logs syncBuf
		a.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		ev := last(t, a)
		if ev.Code != agentwire.CodeAgentProtocol || !strings.Contains(ev.Details, "exit status 3") || !strings.Contains(ev.Details, "oops") {
			t.Fatalf("%+v", ev)
		}
		if !strings.Contains(logs.String(), "turn=turn_1") || !strings.Contains(logs.String(), "line=oops") {
			t.Fatalf("stderr not logged with the turn: %s", logs.String())
		}
	})
	t.Run("malformed line", func(t *testing.T) {
		ev := last(t, script(t, "print('{\"type\":\"text\",\"delta\":\"a\"}')\nprint('nope')\n"))
		if ev.Code != agentwire.CodeAgentProtocol || !strings.Contains(ev.Details, "line 2") {
			t.Fatalf("%+v", ev)
		}
	})
	t.Run("no such program", func(t *testing.T) {
		ev := last(t, &execagent.Agent{Command: []string{"/nonexistent/agent"}})
		if ev.Code != agentwire.CodeAgentStart {
			t.Fatalf("%+v", ev)
		}
	})
	t.Run("argv is not a shell line", func(t *testing.T) {
		a := script(t, "import sys, json\nprint(json.dumps({'type':'completed','data':sys.argv[1:]}))\n")
		a.Command = append(a.Command, "$HOME; echo hi", "*")
		ev := last(t, a)
		if string(ev.Data) != `["$HOME; echo hi", "*"]` {
			t.Fatalf("%s", ev.Data)
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv("CONVLOG_SECRET", "s3cret")
		a := script(t, "import os, json\nprint(json.dumps({'type':'completed','data':[os.environ.get('GREETING'), os.environ.get('CONVLOG_SECRET')]}))\n")
		a.Env = map[string]string{"GREETING": "hi"}
		if ev := last(t, a); string(ev.Data) != `["hi", null]` {
			t.Fatalf("%s", ev.Data)
		}
	})
}

// A cancelled turn takes its program's whole group with it: here a
// grandchild that ignores SIGTERM.
func TestCancelKillsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	a := script(t, `import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"])
open(`+strconv.Quote(pidFile)+`, "w").write(str(child.pid))
print('{"type":"text","delta":"started"}', flush=True)
time.sleep(60)
`)
	a.Grace = 200 * time.Millisecond
	if err := agenttest.CheckStop(a, worker.Scope{}, worker.Prompt{Text: "x"}, 5*time.Second, true); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(b))
	waitGone(t, pid)
}
