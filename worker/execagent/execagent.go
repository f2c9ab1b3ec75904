// Package execagent is the exec agent kind: a program per turn,
// CGI-style. The request JSON goes to its stdin, its stdout is the turn's
// events (NDJSON), its stderr goes to convlog's log with the turn's id
// (rate-limited per turn, lines cut, what was dropped said). argv is run
// as is, never through a shell.
//
// The program never outlives its turn. It runs in a process group of its
// own; cancelling the turn sends the group SIGTERM, then SIGKILL after the
// grace period, and the group is killed when the turn ends in any case,
// and as soon as the program exits: a child it left in the background
// does not hold the turn.
// On Linux the program also gets SIGKILL if convlog itself dies (kill -9
// included), through the parent-death signal.
package execagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"os"
	"os/exec"
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
		req, err := json.Marshal(agentwire.NewRequest(scope, prompt))
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
		// Pipes of our own, not cmd's: cmd.Wait would wait for every
		// holder of the write ends (a child left in the background keeps
		// them), where we wait for the program alone.
		stdout, stdoutW, err := os.Pipe()
		if err != nil {
			stdin.Close()
			yield(worker.Failed(err.Error(), true, agentwire.CodeAgentStart))
			return
		}
		stderr, stderrW, err := os.Pipe()
		if err != nil {
			stdin.Close()
			stdout.Close()
			stdoutW.Close()
			yield(worker.Failed(err.Error(), true, agentwire.CodeAgentStart))
			return
		}
		cmd.Stdout, cmd.Stderr = stdoutW, stderrW
		err = startProcess(cmd)
		stdoutW.Close()
		stderrW.Close()
		if err != nil {
			stdout.Close()
			stderr.Close()
			yield(worker.Failed("start "+a.Command[0]+": "+err.Error(), false, agentwire.CodeAgentStart))
			return
		}
		// From here the program is ours to reap, and every path below
		// waits for it and then kills what is left of its group.
		lastErr := make(chan string, 1)
		go func() {
			defer stderr.Close()
			lastErr <- logStderr(stderr, logger)
		}()
		go func() {
			_, _ = stdin.Write(req)
			stdin.Close()
		}()
		// When the program exits, what it left behind goes with it: a
		// background child holding its output would otherwise hold the
		// turn until it ends (an hour, for "sleep 3600 &"). What the
		// program wrote is still in the pipes; a holder that left the
		// group gets grace to close them.
		var werr error
		exited := make(chan struct{})
		go func() {
			werr = cmd.Wait()
			killGroup(cmd)
			deadline := time.Now().Add(grace)
			_ = stdout.SetReadDeadline(deadline)
			_ = stderr.SetReadDeadline(deadline)
			close(exited)
		}()
		stopCtx, stopNow := context.WithCancel(ctx)
		defer stopNow()
		go func() {
			select {
			case <-stopCtx.Done():
				terminate(cmd)
				select {
				case <-exited:
				case <-time.After(grace):
					killGroup(cmd)
				}
			case <-exited:
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
		if errors.Is(rerr, os.ErrDeadlineExceeded) {
			rerr = fmt.Errorf("%w: %w: the program exited without a completed or failed event, and a process it left outside its group held its output open %v later", agentwire.ErrProtocol, agentwire.ErrNoTerminal, grace)
		}
		if stopped || terminal {
			// Nobody reads its output any more: a program still writing
			// must not block on it while it is being stopped.
			go func() {
				defer stdout.Close()
				_, _ = io.Copy(io.Discard, stdout)
			}()
		} else {
			stdout.Close()
		}
		if stopped {
			stopNow()
		}
		// Give a program that is done a grace period to exit by itself.
		select {
		case <-exited:
		case <-time.After(grace):
			stopNow()
			<-exited
			if !stopped && !terminal && ctx.Err() == nil {
				werr = fmt.Errorf("it closed its output but did not exit within %v: %w", grace, werr)
			}
		}
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

// Bounds of what a turn's stderr puts in the log: a program writing
// without pause (3 s of "yes >&2" grew the log by 395 MB) gets a burst of
// lines, then a few a second, each cut at StderrLineMax bytes; what is
// dropped is counted and said.
const (
	StderrLineMax = 1 << 10 // bytes of a line logged
	StderrBurst   = 100     // lines logged before the rate applies
	StderrRate    = 10      // lines a second after the burst
)

// logStderr copies the program's stderr to the log, a line at a time
// within the bounds above, and returns its last line (cut as logged).
func logStderr(r io.Reader, logger *slog.Logger) string {
	br := bufio.NewReaderSize(r, 4096)
	var last, line []byte
	tokens, refilled := float64(StderrBurst), time.Now()
	droppedLines, droppedBytes := 0, 0
	sayDropped := func() {
		if droppedLines > 0 {
			logger.Warn("agent stderr: lines dropped (rate limit)", "lines", droppedLines, "bytes", droppedBytes)
			droppedLines, droppedBytes = 0, 0
		}
	}
	for {
		// A line is read in slices; only its first StderrLineMax bytes
		// are kept.
		line = line[:0]
		size := 0
		var err error
		for {
			var frag []byte
			frag, err = br.ReadSlice('\n')
			size += len(frag)
			if room := StderrLineMax - len(line); room > 0 {
				line = append(line, frag[:min(room, len(frag))]...)
			}
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		if size > 0 {
			text := bytes.TrimSpace(line)
			if len(text) > 0 || size > len(line) {
				last = append(last[:0], text...)
				now := time.Now()
				tokens = min(StderrBurst, tokens+now.Sub(refilled).Seconds()*StderrRate)
				refilled = now
				if tokens >= 1 {
					tokens--
					sayDropped()
					content := size
					if err == nil {
						content-- // its newline
					}
					if cut := content - len(line); cut > 0 {
						logger.Warn("agent stderr", "line", string(text), "truncated_bytes", cut)
					} else {
						logger.Warn("agent stderr", "line", string(text))
					}
				} else {
					droppedLines++
					droppedBytes += size
				}
			}
		}
		if err != nil {
			break
		}
	}
	sayDropped()
	return string(last)
}
