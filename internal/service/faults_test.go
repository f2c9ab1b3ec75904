package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/internal/servicetest"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

// natsBroker is a nats-server process of the machine's binary, on a port
// of its own, that a test can kill and restart: a separate broker process,
// as the brief asks for broker outages.
type natsBroker struct {
	t    testing.TB
	bin  string
	port int
	dir  string
	cmd  *exec.Cmd
}

func startBroker(t testing.TB) *natsBroker {
	if testing.Short() {
		t.Skip("runs and kills a nats-server process; skipped with -short")
	}
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nats-server"); serr == nil {
			bin, err = "/usr/sbin/nats-server", nil
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and nats-server is not installed: %v", err)
		}
		t.Skipf("nats-server not installed (set CI to make this a failure): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	b := &natsBroker{t: t, bin: bin, port: port, dir: t.TempDir()}
	b.start()
	t.Cleanup(b.kill)
	return b
}

func (b *natsBroker) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", b.port) }

func (b *natsBroker) start() {
	b.t.Helper()
	b.cmd = exec.Command(b.bin, "-a", "127.0.0.1", "-p", fmt.Sprint(b.port), "-js", "-sd", b.dir)
	if err := b.cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	check.For(b.t, 30*time.Second, 20*time.Millisecond, func() error {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", b.port))
		if err != nil {
			return fmt.Errorf("nats-server not answering: %w", err)
		}
		c.Close()
		return nil
	})
}

func (b *natsBroker) kill() {
	if b.cmd != nil && b.cmd.Process != nil {
		b.cmd.Process.Kill()
		b.cmd.Wait()
		b.cmd = nil
	}
}

func readyStatus(t testing.TB, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitReady polls /readyz (a health probe, polled by design) until it
// answers want, within a bound.
func waitReady(t testing.TB, addr string, want int) {
	t.Helper()
	check.For(t, time.Minute, 50*time.Millisecond, func() error {
		if st := readyStatus(t, addr); st != want {
			return fmt.Errorf("/readyz answered %d, want %d", st, want)
		}
		return nil
	})
}

// With the broker down, admission still succeeds (the bbolt commit is the
// admission), /readyz says degraded, and when the broker is back the outbox
// relays everything and every submission is answered.
func TestBrokerOutage(t *testing.T) {
	broker := startBroker(t)
	svc, c := testService(t, func(cfg *Config) { cfg.NATSURL = broker.url() })
	ctx := context.Background()
	first := servicetest.Deliver(t, c, "echo", "i", "s", "before the outage")
	if s, err := c.Submission(ctx, "echo", "i", first.SubmissionID, 20*time.Second); err != nil || s.Status != record.StatusCompleted {
		t.Fatalf("before: %+v %v", s, err)
	}
	waitReady(t, svc.Addr(), http.StatusOK)

	broker.kill()
	waitReady(t, svc.Addr(), http.StatusServiceUnavailable)
	var during []wire.Accepted
	for i := range 20 {
		during = append(during, servicetest.Deliver(t, c, "echo", "i", fmt.Sprint("s", i%4), fmt.Sprint("during the outage ", i)))
	}
	broker.start()
	waitReady(t, svc.Addr(), http.StatusOK)
	for _, acc := range during {
		s, err := c.Submission(ctx, "echo", "i", acc.SubmissionID, 60*time.Second)
		if err != nil || s.Status != record.StatusCompleted {
			t.Fatalf("after the outage: %+v %v", s, err)
		}
	}
}

// SIGTERM-style stop: deliveries get 503 shutting_down, a running turn
// finishes within the shutdown timeout, one that cannot is settled
// interrupted, and nothing leaks (goleak in TestMain).
func TestGracefulStop(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		want    record.Status
		code    string
	}{
		{"turn finishes", 5 * time.Second, record.StatusCompleted, ""},
		{"turn interrupted", 50 * time.Millisecond, record.StatusFailed, "interrupted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := func(cfg *Config) {
				cfg.Data = dir
				cfg.EchoDelay = 20 * time.Millisecond
				cfg.ShutdownTimeout = tc.timeout
			}
			svc, err := Start(withDefaults(t, cfg))
			if err != nil {
				t.Fatal(err)
			}
			c := &client.Client{BaseURL: "http://" + svc.Addr()}
			acc := servicetest.Deliver(t, c, "echo", "i", "s", strings.Repeat("w ", 20)) // ~400 ms of turn
			sr, err := c.Stream(context.Background(), "echo", "i", "s", acc.Offset)
			if err != nil {
				t.Fatal(err)
			}
			for f, err := sr.Next(); f.Type != "delta"; f, err = sr.Next() {
				if err != nil {
					t.Fatal(err)
				}
			}
			sr.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := svc.Stop(context.Background()); err != nil {
					t.Errorf("stop: %v", err)
				}
			}()
			// Admission stops at once.
			check.For(t, 30*time.Second, time.Millisecond, func() error {
				_, err := c.Deliver(context.Background(), "echo", "i",
					wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: "late"}, Session: "s2"}, "")
				if client.IsCode(err, wire.CodeShuttingDown) {
					return nil
				}
				if err != nil && !strings.Contains(err.Error(), "connection refused") {
					t.Fatalf("delivery during stop: %v", err)
				}
				if err != nil {
					return nil // the listener is gone already: also refused
				}
				return errors.New("still admitting during the stop")
			})
			wg.Wait()
			// After a restart the submission has its one settlement.
			svc, err = Start(withDefaults(t, cfg))
			if err != nil {
				t.Fatal(err)
			}
			defer svc.Stop(context.Background())
			c = &client.Client{BaseURL: "http://" + svc.Addr()}
			s, err := c.Submission(context.Background(), "echo", "i", acc.SubmissionID, 10*time.Second)
			if err != nil || s.Status != tc.want || (tc.code != "" && (s.Error == nil || s.Error.Code != tc.code)) {
				t.Fatalf("after stop: %+v %v", s, err)
			}
			recs := servicetest.ReadUntilSettled(t, c, "echo", "i", "s", acc.Offset, acc.SubmissionID)
			n := 0
			for _, r := range recs {
				if r.Entry != nil && r.Entry.Type == record.EntrySettlement {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d settlements", n)
			}
		})
	}
}

// withDefaults fills a Config as testService does, for tests that restart
// a service on the same data folder.
func withDefaults(t testing.TB, mutate func(*Config)) Config {
	cfg := Config{Listen: "127.0.0.1:0", Data: t.TempDir(), Heartbeat: time.Second, ShutdownTimeout: 2 * time.Second,
		Logger: quietLogger()}
	mutate(&cfg)
	return cfg
}
