package transport_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
)

// The adapters are checked with the client libraries people use: the
// scripts under testdata/node drive `convlog serve` (the real binary, built
// here) with the AI SDK's chat, @ag-ui/client's HttpAgent and @a2a-js/sdk's
// client. Node and npm are needed: without them the test is skipped, unless
// CI is set, where it fails.

const nodeDir = "testdata/node"

// nodeTools finds node and npm and installs the pinned packages (npm ci)
// when node_modules is missing.
func nodeTools(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	var npm string
	if err == nil {
		npm, err = exec.LookPath("npm")
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and node/npm are missing: %v", err)
		}
		t.Skipf("node and npm are needed (set CI to make this a failure): %v", err)
	}
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules")); err != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = nodeDir
		out, err := cmd.CombinedOutput()
		t.Logf("npm ci:\n%s", out)
		if err != nil {
			t.Fatalf("npm ci: %v", err)
		}
	}
	return node
}

// buildServer builds cmd/convlog into the test's temp folder.
func buildServer(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the test builds the real binary and needs the go command: %v", err)
	}
	out := filepath.Join(t.TempDir(), "convlog")
	cmd := exec.Command(goBin, "build", "-o", out, "github.com/convlog/convlog/cmd/convlog")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// serverProc is one `convlog serve` process.
type serverProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startServer(t *testing.T, bin, data, addr string) *serverProc {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--listen", addr, "--data", data, "--echo-delay", "20ms",
		"--a2a-default-agent", "echo", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = testLogWriter{t, "convlog: "}, testLogWriter{t, "convlog: "}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProc{t: t, cmd: cmd, addr: addr}
	t.Cleanup(p.kill)
	// /readyz is a health probe, polled by design.
	check.For(t, 30*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return fmt.Errorf("convlog never became ready on %s: %v", addr, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("convlog never became ready on %s: /readyz %d", addr, resp.StatusCode)
		}
		return nil
	})
	return p
}

// kill is kill -9: no shutdown of any kind.
func (p *serverProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
}

type testLogWriter struct {
	t      *testing.T
	prefix string
}

func (w testLogWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(w.prefix + line)
	}
	return len(b), nil
}

// runNode runs node with args against the server; its output goes to the
// test log.
func runNode(t *testing.T, node, url, state string, args ...string) {
	t.Helper()
	cmd := exec.Command(node, args...)
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(), "CONVLOG_URL="+url, "CONVLOG_STATE="+state, "NO_COLOR=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("node %s:\n%s", strings.Join(args, " "), out.String())
	if err != nil {
		t.Fatalf("node %s: %v", strings.Join(args, " "), err)
	}
}

// TestNodeClients runs each library's tests against the real server, then
// the resume across a kill -9: a script leaves answers running and queued,
// the server is killed and restarted on the same data, and a second script
// resumes them with the AI SDK and A2A clients.
func TestNodeClients(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the real binary and runs node; skipped with -short")
	}
	node := nodeTools(t)
	bin := buildServer(t)
	data := t.TempDir()
	addr := freePort(t)
	url := "http://" + addr
	state := filepath.Join(t.TempDir(), "state.json")

	srv := startServer(t, bin, data, addr)
	runNode(t, node, url, state, "--test", "--test-reporter=spec", "aisdk.test.mjs", "agui.test.mjs", "a2a.test.mjs", "goldens.test.mjs")

	runNode(t, node, url, state, "kill-before.mjs")
	srv.kill()
	t.Log("killed convlog with SIGKILL; restarting it on the same data")
	startServer(t, bin, data, addr)
	runNode(t, node, url, state, "--test", "--test-reporter=spec", "kill-after.mjs")
}
