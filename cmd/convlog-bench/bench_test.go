package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The bench runs the service as a child process of its own executable
// (`convlog-bench -child`). Under `go test` that executable is the test
// binary, so this hook turns the test binary into that child: it runs
// before TestMain and never returns.
func init() {
	if os.Getenv(benchChildEnv) != "1" || len(os.Args) < 2 || os.Args[1] != "-child" {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := benchCommand(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestBenchQuick runs every scenario of `convlog bench -quick` end to end:
// the service as a child process, the load shapes, the SSE readers, the
// ceilings, the baselines (reported unavailable, not failed, when the
// machine has no PostgreSQL or Redis), the table, the chart and the doc
// splice. It asserts that each part ran and produced its rows, never how
// fast: absolute times are noise on a shared machine.
func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several services; skipped with -short")
	}
	dir := t.TempDir()
	doc := filepath.Join(dir, "benchmarks.md")
	// Hand-written text around the generated section survives a rerun.
	if err := os.WriteFile(doc, []byte("# Benchmarks\n\nwritten by hand\n\n"+benchDocBegin+"\nold\n"+benchDocEnd+"\n\nalso by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "bench")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := benchOptions{
		quick: true, out: out, doc: doc, baselines: true,
		pgDSN:     "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&connect_timeout=3",
		pgConns:   16,
		redisAddr: "127.0.0.1:6379",
		commands:  "go test -run BenchQuick ./cmd/convlog-bench",
	}
	stdout, err := os.Create(filepath.Join(dir, "stdout.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr := os.Stderr
	if !testing.Verbose() {
		if stderr, err = os.Create(filepath.Join(dir, "stderr.log")); err != nil {
			t.Fatal(err)
		}
		defer stderr.Close()
	}
	if err := runBench(ctx, o, stdout, stderr); err != nil {
		t.Fatalf("bench: %v", err)
	}
	md, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	s := string(md)
	for _, want := range []string{
		"written by hand", "also by hand",
		secBenchCeilings, secBenchAdmission, secBenchE2E, secBenchFanout, secBenchCatchup, secBenchSessions,
		"| bbolt |", "| convlog |", "POST → first SSE delta frame", "KiB/reader", "records/s", "reads/s",
		"#### Targets", "latency.png",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("benchmarks.md lacks %q", want)
		}
	}
	if strings.Contains(s, "\nold\n") {
		t.Error("the old generated section was not replaced")
	}
	for _, sys := range benchBaselines {
		if !strings.Contains(s, benchSystemLabel(sys)) {
			t.Errorf("no row for the %s baseline (measured or unavailable)", sys)
		}
	}
	for _, f := range []string{"latency.png", "latency.csv", "results.md"} {
		if fi, err := os.Stat(filepath.Join(out, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if t.Failed() {
		t.Logf("report:\n%s", s)
	}
}

func TestBenchPercentiles(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	l := benchSummarize(s)
	if l.n != 100 || l.p50 != 50*time.Millisecond || l.p99 != 99*time.Millisecond || l.max != 100*time.Millisecond {
		t.Fatalf("summary %+v", l)
	}
	if got := benchSummarize(nil); got.n != 0 {
		t.Fatalf("empty: %+v", got)
	}
	if b := benchMessageBody("adm-7", 256); len(b) != 256 {
		t.Fatalf("body is %d bytes: %s", len(b), b)
	}
}

func TestBenchSpliceDoc(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "b.md")
	if err := benchSpliceDoc(p, "first"); err != nil {
		t.Fatal(err)
	}
	if err := benchSpliceDoc(p, "second"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if strings.Contains(string(b), "first") || strings.Count(string(b), "second") != 1 || strings.Count(string(b), benchDocBegin) != 1 {
		t.Fatalf("doc:\n%s", b)
	}
}
