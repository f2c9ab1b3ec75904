package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer is a child's stderr, read while the child writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The real binaries with the broker's credentials: `serve` refuses an
// embedded NATS port beyond loopback without the workers' password and
// TLS, and a `convlog worker` given the password runs the turns of a
// `serve --workers=0` whose port needs it.
func TestServeAndWorkerWithBrokerCredentials(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	dir := t.TempDir()

	t.Run("refused beyond loopback", func(t *testing.T) {
		data := filepath.Join(dir, "never")
		out, err := exec.Command(bin, "serve", "--listen", freeAddr(t), "--nats-listen", "0.0.0.0:0", "--data", data, "--insecure").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "refusing to open the embedded NATS without credentials") {
			t.Fatalf("serve --nats-listen 0.0.0.0: %v\n%s", err, out)
		}
		if _, err := os.Stat(data); !os.IsNotExist(err) {
			t.Fatalf("data folder created: %v", err)
		}
	})

	t.Run("worker with the password", func(t *testing.T) {
		pw := filepath.Join(dir, "worker.pw")
		if err := os.WriteFile(pw, []byte("a-long-random-password\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		natsAddr := freeAddr(t)
		p := startServe(t, bin, "--workers=0", "--data", filepath.Join(dir, "data"),
			"--nats-listen", natsAddr, "--nats-worker-password-file", pw)
		p.ready(t)
		// A wrong password is said, not retried in silence.
		bad := filepath.Join(dir, "bad.pw")
		if err := os.WriteFile(bad, []byte("a-guess\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		wrong := exec.Command(bin, "worker", "--nats", "nats://"+natsAddr, "--nats-password-file", bad)
		var wrongErr lockedBuffer
		wrong.Stderr = &wrongErr
		if err := wrong.Start(); err != nil {
			t.Fatal(err)
		}
		// Refused credentials are not mended by retrying: the worker stops
		// and says why (it used to wait forever on a closed connection).
		exited := make(chan error, 1)
		go func() { exited <- wrong.Wait() }()
		select {
		case err := <-exited:
			if err == nil || !strings.Contains(strings.ToLower(wrongErr.String()), "authorization violation") {
				t.Fatalf("a worker with a wrong password: %v\n%s", err, wrongErr.String())
			}
		case <-time.After(time.Minute):
			_ = wrong.Process.Kill()
			<-exited
			t.Fatalf("a worker with a wrong password did not stop:\n%s", wrongErr.String())
		}

		w := exec.Command(bin, "worker", "--nats", "nats://"+natsAddr, "--nats-password-file", pw,
			"--echo-delay", "1ms", "--shutdown-timeout", "1s", "--sweep-interval", "200ms")
		var stderr strings.Builder
		w.Stderr = &stderr
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		exited = make(chan error, 1)
		go func() { exited <- w.Wait() }()
		defer func() {
			_ = w.Process.Signal(syscall.SIGTERM)
			if err := <-exited; err != nil {
				t.Errorf("worker exit: %v\n%s", err, stderr.String())
			}
		}()
		p.echo(t, "creds", "hello over an authenticated broker")
		p.stop(t)
	})
}
