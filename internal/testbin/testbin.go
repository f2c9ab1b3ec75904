// Package testbin builds the programs that tests run as child processes
// (convlog itself, a nats-server, small test tools): each at most once per
// test binary, on first use, into one temporary folder. A package's
// TestMain calls Cleanup when its tests are done. It is a leaf: it imports
// nothing of the product.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

var binaries struct {
	mu    sync.Mutex
	dir   string
	built map[string]*binary
}

type binary struct {
	once sync.Once
	path string
	err  error
}

// Build builds the Go package pkg (an import path, or a directory such as
// ".") as the program name on its first call and returns its path; later
// calls return the same path, or the same build error. Concurrent callers
// of one package wait for its single build.
func Build(pkg, name string) (string, error) {
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
		binaries.built = map[string]*binary{}
	}
	b := binaries.built[pkg]
	if b == nil {
		b = &binary{}
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

// Cleanup removes the folder of the built programs. It is safe to call
// twice, and a later Build starts a new folder.
func Cleanup() {
	binaries.mu.Lock()
	defer binaries.mu.Unlock()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	binaries.dir = ""
	binaries.built = nil
}
