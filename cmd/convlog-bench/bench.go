package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// `convlog bench` starts the real service (as a child process of itself,
// on loopback, with embedded NATS), loads it, and prints a table of p50,
// p99 and max latency and throughput per workload, side by side with the
// ceilings (bare bbolt group commit, JetStream publish-with-ack) and the
// baselines a team would build instead (PostgreSQL with LISTEN/NOTIFY,
// Redis Streams), each measured by this program on this machine in the
// same run. See docs/benchmarks.md.

// The scenarios, in the order they run.
var benchScenarios = []string{"ceilings", "admission", "load", "e2e", "fanout", "catchup", "sessions"}

type benchOptions struct {
	quick     bool
	out       string // folder for latency.png, latency.csv, results.md
	doc       string // markdown file with a generated section to replace
	only      map[string]bool
	baselines bool
	pgDSN     string
	pgConns   int
	redisAddr string
	profile   string // folder for CPU profiles of the service
	readers   int    // > 0: fan-out of one conversation at this size only
	commands  string // the command line, for the report
}

// benchSizes are the workloads' sizes: the in a full run, small
// ones with -quick.
type benchSizes struct {
	clients         int // admission clients
	admissionRounds int
	bodyBytes       int           // delivery body size
	warmup          time.Duration // before a measured window
	window          time.Duration // admission window
	ceilingWindow   time.Duration
	loadRates       []int // offered loads, req/s
	loadStep        time.Duration
	e2eRuns         int
	fanout          []int // reader counts
	fanoutBaseline  []int // reader counts for the baselines
	fanoutWrites    int
	fanoutEvery     time.Duration
	// fan-out across conversations: sessions × readers, rounds of one
	// POST per session, a round every fanManyEvery
	fanManySessions, fanManyReaders, fanManyRounds int
	fanManyEvery                                   time.Duration
	catchup                                        int // records
	catchupPasses                                  int
	sessions                                       []int // checkpoints of the session count
	turns                                          int
	sessionWorkers                                 int
	randomReads                                    int
}

func fullSizes() benchSizes {
	return benchSizes{
		clients: 64, admissionRounds: 3, bodyBytes: 256, warmup: 2 * time.Second, window: 10 * time.Second, ceilingWindow: 5 * time.Second,
		loadRates: []int{500, 1000, 1500, 2000, 3000, 4000, 6000, 8000, 10000}, loadStep: 3 * time.Second,
		e2eRuns: 1000, fanout: []int{1000, 10000}, fanoutBaseline: []int{1000}, fanoutWrites: 20, fanoutEvery: 250 * time.Millisecond,
		fanManySessions: 1000, fanManyReaders: 10, fanManyRounds: 5, fanManyEvery: time.Second,
		catchup: 100_000, catchupPasses: 3, sessions: []int{100, 1000, 10000}, turns: 10, sessionWorkers: 128, randomReads: 10000,
	}
}

func quickSizes() benchSizes {
	return benchSizes{
		clients: 64, admissionRounds: 1, bodyBytes: 256, warmup: 300 * time.Millisecond, window: 1500 * time.Millisecond, ceilingWindow: time.Second,
		loadRates: []int{500, 1500}, loadStep: 700 * time.Millisecond,
		e2eRuns: 40, fanout: []int{50, 200}, fanoutBaseline: []int{50}, fanoutWrites: 4, fanoutEvery: 100 * time.Millisecond,
		fanManySessions: 20, fanManyReaders: 5, fanManyRounds: 2, fanManyEvery: 200 * time.Millisecond,
		catchup: 5_000, catchupPasses: 1, sessions: []int{20, 100}, turns: 2, sessionWorkers: 32, randomReads: 200,
	}
}

func benchCommand(ctx context.Context, args []string) error {
	if len(args) > 0 && (args[0] == "-child" || args[0] == "--child") {
		return runBenchChild(ctx, args[1:])
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	o := benchOptions{}
	fs.BoolVar(&o.quick, "quick", false, "small sizes, a few seconds per scenario (a smoke test, not a measurement)")
	fs.StringVar(&o.out, "out", "docs/bench", "folder for latency.png, latency.csv and results.md; empty writes none")
	fs.StringVar(&o.doc, "doc", "docs/benchmarks.md", "markdown file whose generated section this run replaces; empty writes none")
	only := fs.String("only", "", "comma-separated scenarios to run (default all): "+strings.Join(benchScenarios, ","))
	fs.BoolVar(&o.baselines, "baselines", true, "also measure the PostgreSQL and Redis baselines")
	fs.StringVar(&o.pgDSN, "postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL of the baseline")
	fs.IntVar(&o.pgConns, "postgres-conns", 32, "connections of the PostgreSQL baseline's pool")
	fs.StringVar(&o.redisAddr, "redis", "127.0.0.1:6379", "Redis of the baseline")
	fs.StringVar(&o.profile, "profile", "", "folder for the service's CPU profiles during admission, fan-out and catch-up; empty for none")
	fs.IntVar(&o.readers, "readers", 0, "fan-out of one conversation at this many readers only, without the across-conversations row (a focused run)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %q", fs.Args())
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, s := range strings.Split(*only, ",") {
			s = strings.TrimSpace(s)
			if !slices.Contains(benchScenarios, s) {
				return fmt.Errorf("bench: unknown scenario %q (have %s)", s, strings.Join(benchScenarios, ","))
			}
			o.only[s] = true
		}
	}
	o.commands = "convlog bench " + strings.Join(args, " ")
	return runBench(ctx, o, os.Stdout, os.Stderr)
}

// benchEnv is one run: its options, sizes, report and scratch folder.
type benchEnv struct {
	opts    benchOptions
	sz      benchSizes
	rep     *benchReport
	tmp     string
	logf    func(format string, args ...any)
	nofile  uint64
	started time.Time
}

func runBench(ctx context.Context, o benchOptions, stdout, stderr *os.File) error {
	sz := fullSizes()
	if o.quick {
		sz = quickSizes()
	}
	if o.readers > 0 {
		sz.fanout = []int{o.readers}
	}
	tmp, err := os.MkdirTemp("", "convlog-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	e := &benchEnv{
		opts: o, sz: sz, rep: newBenchReport(), tmp: tmp, started: time.Now(),
	}
	e.logf = func(format string, args ...any) {
		fmt.Fprintf(stderr, "bench %6.1fs  %s\n", time.Since(e.started).Seconds(), fmt.Sprintf(format, args...))
	}
	e.nofile = benchRaiseFileLimit()
	if need := uint64(max(slices.Max(sz.fanout), 1)) + 512; e.nofile < need {
		e.logf("open-file limit %d is below %d: fan-out readers will fail", e.nofile, need)
	}
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			return err
		}
	}
	e.rep.machine = benchDescribeMachine(ctx, o)

	var errs []error
	for _, name := range benchScenarios {
		if o.only != nil && !o.only[name] {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		e.logf("== %s", name)
		var err error
		switch name {
		case "ceilings":
			err = e.ceilings(ctx)
		case "admission":
			err = e.admission(ctx)
		case "load":
			err = e.offeredLoad(ctx)
		case "e2e":
			err = e.endToEnd(ctx)
		case "fanout":
			err = e.fanout(ctx)
		case "catchup":
			err = e.catchUp(ctx)
		case "sessions":
			err = e.manySessions(ctx)
		}
		if err != nil {
			e.logf("%s failed: %v", name, err)
			e.rep.failures = append(e.rep.failures, fmt.Sprintf("%s: %v", name, err))
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	e.rep.elapsed = time.Since(e.started)
	md := e.rep.markdown(e)
	fmt.Fprintln(stdout, md)
	if o.out != "" {
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(o.out, "results.md"), []byte(md), 0o644); err != nil {
			return err
		}
		if err := e.rep.writeChart(o.out); err != nil {
			errs = append(errs, fmt.Errorf("chart: %w", err))
		}
	}
	if o.doc != "" {
		if err := benchSpliceDoc(o.doc, md); err != nil {
			errs = append(errs, fmt.Errorf("doc: %w", err))
		}
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// withService runs fn against a fresh service on a fresh data folder;
// prep, if set, fills the folder first (the service is not running then).
func (e *benchEnv) withService(ctx context.Context, name string, prep func(dir string) error, fn func(c *benchChild) error) error {
	return e.withServiceDelay(ctx, name, prep, 0, fn)
}

// withServiceDelay is withService with the echo agent's delay between
// words set.
func (e *benchEnv) withServiceDelay(ctx context.Context, name string, prep func(dir string) error, echoDelay time.Duration, fn func(c *benchChild) error) error {
	return e.withServiceArgs(ctx, name, prep, []string{"-echo-delay", echoDelay.String()}, fn)
}

// withServiceArgs is withService with more arguments for the child.
func (e *benchEnv) withServiceArgs(ctx context.Context, name string, prep func(dir string) error, args []string, fn func(c *benchChild) error) error {
	dir := filepath.Join(e.tmp, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if prep != nil {
		if err := prep(dir); err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
	}
	c, err := startBenchChild(ctx, append([]string{"-data", dir}, args...))
	if err != nil {
		return err
	}
	ferr := fn(c)
	serr := c.stop()
	if serr != nil {
		serr = fmt.Errorf("stopping the service: %w", serr)
	}
	return errors.Join(ferr, serr)
}

func (e *benchEnv) profilePath(name string) string {
	if e.opts.profile == "" {
		return ""
	}
	return filepath.Join(e.opts.profile, name)
}
