package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/convlog/convlog/internal/testbin"
)

// TestMain removes the folder of the binary built for the tests once they
// are done.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		testbin.Cleanup()
		os.Exit(code)
	}))
}

// builtCLI returns the path of the convlog binary, built at most once per
// `go test` run; a build that failed fails every test that asks for it.
func builtCLI(t *testing.T) string {
	t.Helper()
	path, err := testbin.Build("github.com/convlog/convlog/cmd/convlog", "convlog")
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	return path
}

// buildCLI is builtCLI for the tests that skip with -short.
func buildCLI(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the real binary; skipped with -short")
	}
	return builtCLI(t)
}
