package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// A program written for the test is built once however many tests ask
// for it at the same time, runs, and is gone after Cleanup.
func TestBuildOnceAndCleanup(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(src, "go.mod"), []byte("module hello\n\ngo 1.21\n"), 0o644))
	must(os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644))
	wd, err := os.Getwd()
	must(err)
	must(os.Chdir(src))
	t.Cleanup(func() { _ = os.Chdir(wd) })

	var wg sync.WaitGroup
	paths := make([]string, 4)
	errs := make([]error, 4)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = Build(".", "hello") })
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Fatalf("build %d: %q %v (first %q)", i, paths[i], errs[i], paths[0])
		}
	}
	out, err := exec.Command(paths[0]).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello" {
		t.Fatalf("run: %q %v", out, err)
	}
	Cleanup()
	Cleanup()
	if _, err := os.Stat(paths[0]); !os.IsNotExist(err) {
		t.Fatalf("after Cleanup the program is still there: %v", err)
	}
	if _, err := Build("./nope", "nope"); err == nil || !strings.Contains(err.Error(), "go build ./nope") {
		t.Fatalf("a package that does not build: %v", err)
	}
	Cleanup()
}
