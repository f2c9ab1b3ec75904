package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// TestMain removes the folder of the binary built for the tests once they
// are done.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if cli.dir != "" {
			os.RemoveAll(cli.dir)
		}
		os.Exit(code)
	}))
}

// cli is the convlog binary, built at most once per `go test` run, on
// first use, into a folder TestMain removes.
var cli struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// builtCLI returns the path of the binary, building it on the first call;
// a build that failed fails every test that asks for it.
func builtCLI(t *testing.T) string {
	t.Helper()
	cli.once.Do(func() {
		dir, err := os.MkdirTemp("", "convlog-test-bin-")
		if err != nil {
			cli.err = err
			return
		}
		cli.dir = dir
		bin := filepath.Join(dir, "convlog")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			cli.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		cli.path = bin
	})
	if cli.err != nil {
		t.Fatalf("build: %v", cli.err)
	}
	return cli.path
}

// buildCLI is builtCLI for the tests that skip with -short.
func buildCLI(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the real binary; skipped with -short")
	}
	return builtCLI(t)
}
