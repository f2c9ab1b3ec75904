package main

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
)

// The real binary on SIGTERM: exits 0 after settling.
func TestSIGTERMExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the real binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "convlog")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "serve", "--listen", addr, "--data", t.TempDir(), "--shutdown-timeout", "100ms", "--echo-delay", "50ms")
	var out strings.Builder
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	c := &client.Client{BaseURL: "http://" + addr}
	deadline := time.Now().Add(20 * time.Second)
	var acc transport.Accepted
	for {
		var err error
		acc, err = c.Deliver(context.Background(), "echo", "i", transport.DeliverRequest{Message: transport.Message{Kind: "user", Body: "a b c d e f g h i j"}, Session: "s"}, "")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("service never answered: %v\n%s", err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = acc
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if err != nil {
		t.Fatalf("exit: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "convlog stopped") {
		t.Fatalf("no clean stop in the log:\n%s", out.String())
	}
}
