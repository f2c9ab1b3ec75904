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

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		removeBinaries()
		os.Exit(code)
	}))
}

// binaries are the programs the tests build, each at most once per
// `go test` run, on first use, into one folder that TestMain removes.
var binaries struct {
	mu    sync.Mutex
	dir   string
	built map[string]*builtBinary
}

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

// buildOnce builds the Go package pkg as the program name on its first
// call and returns its path; later calls return the same path, or the
// same build error.
func buildOnce(pkg, name string) (string, error) {
	binaries.mu.Lock()
	if binaries.dir == "" {
		dir, err := os.MkdirTemp("", "convlog-test-bin-")
		if err != nil {
			binaries.mu.Unlock()
			return "", err
		}
		binaries.dir = dir
	}
	if binaries.built == nil {
		binaries.built = map[string]*builtBinary{}
	}
	b := binaries.built[pkg]
	if b == nil {
		b = &builtBinary{}
		binaries.built[pkg] = b
	}
	dir := binaries.dir
	binaries.mu.Unlock()
	b.once.Do(func() {
		path := filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", path, pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
			return
		}
		b.path = path
	})
	return b.path, b.err
}

// removeBinaries removes the folder of the built programs.
func removeBinaries() {
	binaries.mu.Lock()
	defer binaries.mu.Unlock()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
}
