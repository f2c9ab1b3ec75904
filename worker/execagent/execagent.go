// Package execagent is the exec agent kind: a program per turn,
// CGI-style. The request JSON goes to its stdin, its stdout is the turn's
// events (NDJSON), its stderr goes to convlog's log with the turn's id.
// argv is run as is, never through a shell.
//
// The program never outlives its turn. It runs in a process group of its
// own; cancelling the turn sends the group SIGTERM, then SIGKILL after the
// grace period, and the group is killed when the turn ends in any case.
// On Linux the program also gets SIGKILL if convlog itself dies (kill -9
// included), through the parent-death signal.
package execagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agentwire"
)

// Agent runs Command for each turn.
type Agent struct {
	Command []string
	Dir     string
	// Env is added to the few variables inherited from convlog (PATH,
	// HOME, LANG, TMPDIR, ...): the program does not see convlog's
	// secrets unless they are passed here.
	Env map[string]string
	// Grace is how long the program has between SIGTERM and SIGKILL.
	// Default 2s.
	Grace  time.Duration
	Logger *slog.Logger
}

// inherited are the variables of convlog's environment a program gets.
var inherited = []string{"PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "TZ", "SYSTEMROOT"}

// Invoke implements worker.Agent.
func (a *Agent) Invoke(ctx context.Context, scope worker.Scope, prompt worker.Prompt) iter.Seq[worker.Event] {
	return func(yield func(worker.Event) bool) {
		if len(a.Command) == 0 || a.Command[0] == "" {
			yield(worker.Failed("no command to run", false, agentwire.CodeAgentStart))
			return
		}
		logger := a.Logger
		if logger == nil {
			logger = slog.Default()
		}
		logger = logger.With("agent", scope.Agent, "turn", scope.TurnID, "program", a.Command[0])
		grace := a.Grace
		if grace <= 0 {
			grace = 2 * time.Second
		}
		req, err := json.Marshal(agentwire.Request{Scope: scope, Prompt: prompt})
		if err != nil {
			yield(worker.Failed("encode the request: "+err.Error(), false, agentwire.CodeAgentProtocol))
			return
		}
		cmd := exec.Command(a.Command[0], a.Command[1:]...)
		cmd.Dir = a.Dir
		for _, k := range inherited {
			if v, ok := os.LookupEnv(k); ok {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
		}
		for k, v := range a.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		setProcAttr(cmd)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			yield(worker.Failed(err.Error(), true, agentwire.CodeAgentStart))
			return
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			yield(worker.Failed(err.Error(), true, agentwire.CodeAgentStart))
			return
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			yield(worker.Failed(err.Error(), true, agentwire.CodeAgentStart))
			return
		}
		if err := startProcess(cmd); err != nil {
			yield(worker.Failed("start "+a.Command[0]+": "+err.Error(), false, agentwire.CodeAgentStart))
			return
		}
		// From here the program is ours to reap, and every path below
		// waits for it and then kills what is left of its group.
		lastErr := make(chan string, 1)
		go func() { lastErr <- logStderr(stderr, logger) }()
		go func() {
			_, _ = stdin.Write(req)
			stdin.Close()
		}()
		stopCtx, stopNow := context.WithCancel(ctx)
		defer stopNow()
		reaped := make(chan struct{})
		go func() {
			select {
			case <-stopCtx.Done():
				terminate(cmd)
				select {
				case <-reaped:
				case <-time.After(grace):
					killGroup(cmd)
				}
			case <-reaped:
			}
		}()
		stopped := false
		terminal, rerr := agentwire.Read(stdout, agentwire.NDJSON, func(ev worker.Event) bool {
			if ctx.Err() != nil || !yield(ev) {
				stopped = true
				return false
			}
			return true
		})
		if stopped || terminal {
			// Nobody reads its output any more: a program still writing
			// must not block on it while it is being stopped.
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
		}
		if stopped {
			stopNow()
		}
		// Wait only once reading is over (Wait closes the pipe), and give
		// a program that is done a grace period to exit by itself.
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		var werr error
		select {
		case werr = <-waited:
		case <-time.After(grace):
			stopNow()
			werr = <-waited
			if !stopped && !terminal && ctx.Err() == nil {
				werr = fmt.Errorf("it closed its output but did not exit within %v: %w", grace, werr)
			}
		}
		close(reaped)
		killGroup(cmd) // whatever it left behind
		last := <-lastErr
		if stopped || terminal || ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(rerr, agentwire.ErrProtocol):
			err := rerr
			if werr != nil {
				err = fmt.Errorf("%w (%v)", err, werr)
			}
			if last != "" {
				err = fmt.Errorf("%w; its last stderr line: %s", err, last)
			}
			yield(agentwire.ProtocolFailure(err))
		case rerr != nil:
			yield(worker.Failed("reading the program's output: "+rerr.Error(), true, agentwire.CodeAgentProtocol))
		}
	}
}

// logStderr copies the program's stderr to the log, a line at a time, and
// returns its last line.
func logStderr(r io.Reader, logger *slog.Logger) string {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	last := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		last = line
		logger.Warn("agent stderr", "line", line)
	}
	_, _ = io.Copy(io.Discard, r)
	return last
}
