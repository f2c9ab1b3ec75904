package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker/agenttest"
)

// kill -9 of convlog during an exec turn leaves no child alive: the real
// binary, a real program that would sleep for a minute.
func TestExecKill9LeavesNoChild(t *testing.T) {
	py := agenttest.Python(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	script := filepath.Join(dir, "slow.py")
	os.WriteFile(script, []byte(`import os, sys, time
open(`+strconv.Quote(pidFile)+`, "w").write(str(os.getpid()))
print('{"type":"text","delta":"working"}', flush=True)
time.sleep(60)
`), 0o644)
	cfgFile := filepath.Join(dir, "convlog.yaml")
	os.WriteFile(cfgFile, []byte(fmt.Sprintf("agents:\n  - name: slow\n    kind: exec\n    command: [%q, %q]\n", py, script)), 0o644)
	bin := builtCLI(t)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "serve", "--listen", addr, "--data", filepath.Join(dir, "data"), "--config", cfgFile)
	var out strings.Builder
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	c := &client.Client{BaseURL: "http://" + addr}
	check.For(t, time.Minute, 20*time.Millisecond, func() error {
		_, err := c.Deliver(context.Background(), "slow", "i", wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: "go"}}, "")
		if err != nil {
			return fmt.Errorf("service never answered: %w\n%s", err, out.String())
		}
		return nil
	})
	var pid int
	check.For(t, time.Minute, 10*time.Millisecond, func() error {
		if b, err := os.ReadFile(pidFile); err == nil && len(b) > 0 {
			pid, _ = strconv.Atoi(string(b))
		}
		if pid == 0 {
			return fmt.Errorf("the program never started\n%s", out.String())
		}
		return nil
	})
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the program %d is not running: %v", pid, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	check.For(t, 30*time.Second, 10*time.Millisecond, func() error {
		if syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("the program %d outlived convlog", pid)
		}
		return nil
	})
}

// A bad config file stops serve before it listens, with one line naming
// the file, the line and the field.
func TestServeRefusesBadConfig(t *testing.T) {
	f := filepath.Join(t.TempDir(), "convlog.yaml")
	os.WriteFile(f, []byte("agents:\n  - name: a\n    kind: nope\n"), 0o644)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	err := serveCommand(context.Background(), []string{"--listen", addr, "--data", t.TempDir(), "--config", f})
	if err == nil || err.Error() != f+`:3: agents[0].kind: unknown kind "nope" (want openai, http, exec or echo)` {
		t.Fatalf("%v", err)
	}
	if conn, err := net.Dial("tcp", addr); err == nil {
		conn.Close()
		t.Fatal("it listened")
	}
}

// The auth section of the config file turns access control on: a file
// with only that section serves echo, to token holders only.
func TestServeConfigAuthSection(t *testing.T) {
	f := filepath.Join(t.TempDir(), "convlog.yaml")
	// sha256("test") = 9f86d08…
	os.WriteFile(f, []byte(`auth:
  tokens:
    - sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      principal: ops
      scopes: ["read:*/*", "deliver:*/*"]
`), 0o644)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serveCommand(ctx, []string{"--listen", addr, "--data", t.TempDir(), "--config", f, "--log-level", "error"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	post := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/agents/echo/i", strings.NewReader(`{"message":"hi"}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	check.For(t, time.Minute, 20*time.Millisecond, func() error {
		if post("") == 0 {
			return errors.New("serve never listened")
		}
		return nil
	})
	if st := post(""); st != http.StatusUnauthorized {
		t.Fatalf("without a token: %d", st)
	}
	if st := post("test"); st != http.StatusAccepted {
		t.Fatalf("with the token: %d", st)
	}
}
