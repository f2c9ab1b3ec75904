package agenttest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Python is the path of python3. Without one the test is skipped, except
// under CI (CI set), where a missing python3 is a failure: the kinds that
// run real agents must be exercised there.
func Python(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3 is required under CI: %v", err)
		}
		t.Skipf("python3 not found: %v", err)
	}
	return p
}

// ExampleAgent is the path of docs/examples/agent.py, the Python agent of
// docs/agents.md, found from the working directory up to go.mod.
func ExampleAgent(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "docs", "examples", "agent.py")
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("go.mod not found above the working directory")
		}
		dir = up
	}
}

// StartHTTPAgent runs the example agent as an http agent on a free
// loopback port, stopped with the test, and returns its URL.
func StartHTTPAgent(t testing.TB) string {
	t.Helper()
	cmd := exec.Command(Python(t), ExampleAgent(t), "0")
	if testing.Verbose() {
		cmd.Stderr = os.Stderr // its request log
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	port := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		port <- strings.TrimSpace(line)
	}()
	select {
	case p := <-port:
		if p == "" {
			t.Fatal("the python agent printed no port")
		}
		return "http://127.0.0.1:" + p + "/invoke"
	case <-time.After(30 * time.Second):
		t.Fatal("the python agent did not start within 30s")
	}
	return ""
}
