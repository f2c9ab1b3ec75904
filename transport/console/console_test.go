package console_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/convlog/convlog/internal/testbin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

// need finds a program, or skips; under CI a missing one is a failure, so
// that the browser test cannot silently stop running.
func need(t *testing.T, what string, names ...string) string {
	t.Helper()
	for _, n := range names {
		if n == "" {
			continue
		}
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is required under CI (looked for %q)", what, names)
	}
	t.Skipf("%s not found (looked for %q)", what, names)
	return ""
}

func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("%s %q:\n%s", name, args, out.String())
	if err != nil {
		t.Fatalf("%s %q: %v", name, args, err)
	}
}

// TestBrowser drives the console in Debian's chromium through
// puppeteer-core (testdata/browser) against the real binary, built here.
// With CONVLOG_SCREENSHOTS=DIR it also writes the docs' screenshots there.
func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the real binary, kills it and drives a browser; skipped with -short")
	}
	node := need(t, "node", "node")
	chromium := need(t, "chromium", os.Getenv("CHROMIUM_BIN"), "chromium", "chromium-browser")
	dir := filepath.Join("testdata", "browser")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "puppeteer-core")); err != nil {
		npm := need(t, "npm (to install puppeteer-core)", "npm")
		run(t, dir, nil, npm, "ci", "--no-audit", "--no-fund")
	}
	bin := map[string]string{}
	for pkg, name := range map[string]string{
		"github.com/convlog/convlog/cmd/convlog":                         "convlog",
		"github.com/convlog/convlog/transport/jsclient/testdata/logtool": "logtool",
	} {
		path, err := testbin.Build(pkg, name)
		if err != nil {
			t.Fatal(err)
		}
		bin[name] = path
	}
	env := []string{
		"CONVLOG_BIN=" + bin["convlog"],
		"CONVLOG_LOGTOOL=" + bin["logtool"],
		"CHROMIUM_BIN=" + chromium,
	}
	run(t, dir, env, node, "--test", "--test-reporter=tap", "--test-timeout=180000", "console.test.js")
}
