package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker/natsbus"
)

// serveProcess is a real `convlog serve` child.
type serveProcess struct {
	cmd    *exec.Cmd
	addr   string
	stderr bytes.Buffer // read only after exited
	exited chan error
}

func startServe(t *testing.T, bin string, args ...string) *serveProcess {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := &serveProcess{addr: addr, exited: make(chan error, 1)}
	p.cmd = exec.Command(bin, append([]string{"serve", "--listen", addr, "--shutdown-timeout", "1s", "--echo-delay", "1ms"}, args...)...)
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// wait waits for the process to exit by itself, within a bound that only
// keeps a broken build from hanging the test.
func (p *serveProcess) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err // for the cleanup
		return err
	case <-time.After(2 * time.Minute):
		t.Fatalf("convlog serve on %s did not exit", p.addr)
		return nil
	}
}

// ready polls /readyz (a health probe, polled by design) until it answers
// 200, failing if the process exits first.
func (p *serveProcess) ready(t *testing.T) {
	t.Helper()
	check.For(t, time.Minute, 50*time.Millisecond, func() error {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("convlog serve exited: %v\n%s", err, p.stderr.String())
		default:
		}
		resp, err := http.Get("http://" + p.addr + "/readyz")
		if err != nil {
			return fmt.Errorf("convlog serve on %s never ready: %w", p.addr, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("convlog serve on %s never ready: /readyz %d", p.addr, resp.StatusCode)
		}
		return nil
	})
}

func (p *serveProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.stderr.String())
	}
}

// echo delivers text to the echo agent and waits for it to complete.
func (p *serveProcess) echo(t *testing.T, session, text string) {
	t.Helper()
	c := &client.Client{BaseURL: "http://" + p.addr}
	ctx := context.Background()
	acc, err := c.Deliver(ctx, "echo", "two", wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: text}, Session: session}, "")
	if err != nil {
		t.Fatalf("deliver: %v", err)
	}
	for range 20 {
		s, err := c.Submission(ctx, "echo", "two", acc.SubmissionID, 5*time.Second) // a long poll
		if err != nil {
			t.Fatal(err)
		}
		if s.Status.Terminal() {
			if s.Status != "completed" {
				t.Fatalf("submission %+v", s)
			}
			return
		}
	}
	t.Fatalf("submission %s not settled", acc.SubmissionID)
}

// machineNATS is the machine's NATS server with JetStream, which these
// tests need; under CI its absence is a failure.
func machineNATS(t *testing.T) string {
	t.Helper()
	const addr = "127.0.0.1:4222"
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and the machine's NATS is not answering on %s: %v", addr, err)
		}
		t.Skipf("no NATS on %s (start it, or set CI to make this a failure): %v", addr, err)
	}
	conn.Close()
	return "nats://" + addr
}

// dropNamespace deletes what a test's namespace left on the shared broker.
func dropNamespace(t *testing.T, url string, ns natsbus.Namespace) {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Logf("cleanup broker: %v", err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx := context.Background()
	if err := js.DeleteStream(ctx, ns.StreamName()); err != nil {
		t.Logf("cleanup broker: %v", err)
	}
	if err := js.DeleteKeyValue(ctx, strings.ReplaceAll(string(ns), "-", "_")+"_leases"); err != nil {
		t.Logf("cleanup broker: %v", err)
	}
}

// Issue 8 item 19: two `serve` processes with different data folders on
// one external NATS and one namespace. The second is refused, saying why
// and what to do, and exits; the first goes on serving. Once the first has
// stopped (and released its claim), the second folder may use the
// namespace.
func TestTwoFoldersOneNamespace(t *testing.T) {
	bin := buildCLI(t)
	url := machineNATS(t)
	ns := fmt.Sprintf("two-%d", time.Now().UnixNano())
	t.Cleanup(func() { dropNamespace(t, url, natsbus.Namespace(ns)) })
	dirA, dirB := t.TempDir(), t.TempDir()
	args := func(dir string) []string { return []string{"--data", dir, "--nats", url, "--nats-namespace", ns} }

	a := startServe(t, bin, args(dirA)...)
	a.ready(t)
	a.echo(t, "s", "first folder")

	b := startServe(t, bin, args(dirB)...)
	err := b.wait(t)
	msg := b.stderr.String()
	if err == nil || !strings.Contains(msg, "nats namespace in use by another data folder") || !strings.Contains(msg, "--nats-namespace") {
		t.Fatalf("second folder: exit %v\n%s", err, msg)
	}
	t.Logf("second folder refused:\n%s", msg)
	a.echo(t, "s", "first folder, still served")
	a.stop(t)

	b2 := startServe(t, bin, args(dirB)...)
	b2.ready(t)
	b2.echo(t, "s", "second folder, after the first stopped")
	b2.stop(t)
}
