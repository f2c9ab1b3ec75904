package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// tortureChild is one run of a process the torture test starts: the service or the
// external broker. Its stdout and stderr are appended to a log file, which
// the process writes directly (no copying goroutine).
type tortureChild struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	logf    *os.File
	started time.Time

	done   chan struct{} // closed when the process has exited and been reaped
	err    error         // Wait's result, set before done is closed
	ended  time.Time     // when Wait returned, set before done is closed
	killed atomic.Bool   // the torture killed or stopped it on purpose
}

// startTortureChild starts path with args. Its output goes to logPath (appended,
// after a header naming this start), so that every incarnation of the
// service leaves its lines in one file.
func startTortureChild(name, path string, args []string, logPath string) (*tortureChild, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	fmt.Fprintf(f, "=== torture: %s start at %s: %s %s\n", name, time.Now().Format(time.RFC3339Nano), path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = tortureSysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &tortureChild{name: name, logPath: logPath, cmd: cmd, logf: f, started: time.Now(), done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		c.ended = time.Now()
		f.Close()
		close(c.done)
	}()
	return c, nil
}

// kill sends SIGKILL and waits for the process to be reaped.
func (c *tortureChild) kill() error {
	c.killed.Store(true)
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", c.name, err)
	}
	select {
	case <-c.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) not reaped 10s after SIGKILL", c.name, c.cmd.Process.Pid)
	}
}

// stop sends SIGTERM and waits up to timeout, then kills. It returns the
// process's exit error (nil for a clean exit 0) and how long it took.
func (c *tortureChild) stop(timeout time.Duration) (time.Duration, error) {
	c.killed.Store(true)
	start := time.Now()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return time.Since(start), c.err
	case <-time.After(timeout):
	}
	if err := c.kill(); err != nil {
		return time.Since(start), err
	}
	return time.Since(start), fmt.Errorf("%s did not stop within %s of SIGTERM; killed", c.name, timeout)
}

// exited reports whether the process is gone.
func (c *tortureChild) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// describeExit says how the process ended and shows the end of its log.
func (c *tortureChild) describeExit() string {
	status := "exit 0"
	if c.err != nil {
		status = c.err.Error()
	}
	return fmt.Sprintf("%s (pid %d) ended after %s: %s; last lines of %s:\n%s",
		c.name, c.cmd.Process.Pid, c.ended.Sub(c.started).Round(time.Millisecond), status, c.logPath, tortureTail(c.logPath, 8))
}

// tortureTail returns the last n lines of a file, indented.
func tortureTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "    (" + err.Error() + ")"
	}
	if len(b) > 64<<10 {
		b = b[len(b)-64<<10:]
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// tortureFreePort asks the kernel for a free loopback TCP port. The listener is
// closed at once: the port is reused by the child, and re-bound after each
// kill (Go sets SO_REUSEADDR, so TIME_WAIT does not block it).
func tortureFreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tortureWaitHealthy polls GET /healthz until it answers 200, the child exits, or
// timeout passes.
func tortureWaitHealthy(ctx context.Context, hc *http.Client, c *tortureChild, base string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, base+"/healthz", nil)
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				rcancel()
				return nil
			}
		}
		rcancel()
		select {
		case <-c.done:
			return fmt.Errorf("service exited before it was healthy: %s", c.describeExit())
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("service not healthy after %s (last error %v); last lines of %s:\n%s", timeout, err, c.logPath, tortureTail(c.logPath, 20))
			}
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tortureWaitJetStream waits until the broker at url answers a JetStream account
// request: listening is not enough, the service's first act is to create
// its stream.
func tortureWaitJetStream(ctx context.Context, c *tortureChild, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		last = torturePingJetStream(ctx, url)
		if last == nil {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("broker exited before JetStream was ready: %s", c.describeExit())
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("broker's JetStream not ready after %s: %v", timeout, last)
			}
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func torturePingJetStream(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect(), nats.Name("convlog-torture-probe"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(actx)
	return err
}

// tortureBrokerArgs is the command line of the external broker the torture runs
// itself: loopback only, JetStream storing under dir.
func tortureBrokerArgs(port int, dir string) []string {
	return []string{"-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", dir}
}

// tortureLookNATSServer finds the nats-server binary: the given path or name on
// PATH, then /usr/sbin and /usr/local/bin (often missing from a user's PATH).
func tortureLookNATSServer(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if !strings.ContainsRune(name, os.PathSeparator) {
		for _, dir := range []string{"/usr/sbin", "/usr/local/bin", "/usr/local/sbin"} {
			p := dir + string(os.PathSeparator) + name
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%s not found on PATH, /usr/sbin or /usr/local/bin", name)
}

// tortureProgress is w, or io.Discard when there is none.
func tortureProgress(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// tortureCleanupBroker deletes, on a broker the torture does not own,
// every stream of its namespace: the submissions stream and the workers'
// key-value buckets (streams too). The namespace holds a unique number, so
// nothing else matches.
func tortureCleanupBroker(ctx context.Context, url, ns string) error {
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.NoReconnect(), nats.Name("convlog-torture-cleanup"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	token := strings.ToLower(strings.ReplaceAll(ns, "-", "_"))
	names := js.StreamNames(ctx)
	var doomed []string
	for name := range names.Name() {
		if strings.Contains(strings.ToLower(name), token) {
			doomed = append(doomed, name)
		}
	}
	if err := names.Err(); err != nil {
		return err
	}
	var errs []error
	for _, name := range doomed {
		if err := js.DeleteStream(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("delete stream %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
