package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The real binaries with the broker's credentials: `serve` refuses an
// embedded NATS port beyond loopback without the workers' password and
// TLS, and a `convlog worker` given the password runs the turns of a
// `serve --workers=0` whose port needs it.
func TestServeAndWorkerWithBrokerCredentials(t *testing.T) {
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
		w := exec.Command(bin, "worker", "--nats", "nats://"+natsAddr, "--nats-password-file", pw,
			"--echo-delay", "1ms", "--shutdown-timeout", "1s", "--sweep-interval", "200ms")
		var stderr strings.Builder
		w.Stderr = &stderr
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
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
