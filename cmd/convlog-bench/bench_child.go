package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/convlog/convlog/internal/service"
)

// The service under test runs as a child process of the bench, `convlog
// convlog-bench -child`: the real service.Start on 127.0.0.1:0, so that its
// resident memory and CPU profile are its own and not the load
// generator's. It prints one line with its addresses, then serves until
// SIGTERM or until its stdin closes (the bench went away).

const benchChildEnv = "CONVLOG_BENCH_CHILD"

func runBenchChild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench -child", flag.ContinueOnError)
	data := fs.String("data", "", "data folder")
	echoDelay := fs.Duration("echo-delay", 0, "the echo agent's delay")
	heartbeat := fs.Duration("heartbeat", time.Minute, "SSE keepalive period")
	baseline := fs.String("baseline", "", "serve a baseline (postgres, redis) instead of convlog")
	pgDSN := fs.String("postgres", "", "the PostgreSQL baseline's database")
	pgConns := fs.Int("postgres-conns", 16, "the PostgreSQL baseline's pool size")
	channel := fs.String("channel", "", "the PostgreSQL baseline's NOTIFY channel")
	redisAddr := fs.String("redis", "", "the Redis baseline's server")
	prefix := fs.String("prefix", "", "the Redis baseline's key prefix")
	if err := fs.Parse(args); err != nil {
		return err
	}
	benchRaiseFileLimit()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the parent holds our stdin: EOF means it is gone
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// The runtime's memory: where the resident set goes.
	mux.HandleFunc("/debug/memstats", func(w http.ResponseWriter, r *http.Request) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		fmt.Fprintf(w, "%d %d %d %d\n", m.HeapInuse, m.StackInuse, m.Sys, runtime.NumGoroutine())
	})
	var (
		addr   string
		stop   func(context.Context) error
		failed <-chan error
	)
	switch *baseline {
	case "":
		svc, err := service.Start(service.Config{
			Listen:          "127.0.0.1:0",
			Data:            *data,
			EchoDelay:       *echoDelay,
			Heartbeat:       *heartbeat,
			ShutdownTimeout: 5 * time.Second,
			// The bench builds some logs directly with the engine, without
			// a JetStream store beside them.
			Init:   true,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		})
		if err != nil {
			return err
		}
		// The log's group-commit counters: commits and the writes they carried.
		mux.HandleFunc("/debug/commits", func(w http.ResponseWriter, r *http.Request) {
			commits, writes := svc.CommitStats()
			fmt.Fprintf(w, "%d %d\n", commits, writes)
		})
		// The SSE streams' socket writes and bytes.
		mux.HandleFunc("/debug/streams", func(w http.ResponseWriter, r *http.Request) {
			writes, bytes := svc.StreamWrites()
			fmt.Fprintf(w, "%d %d\n", writes, bytes)
		})
		addr, stop, failed = svc.Addr(), svc.Stop, svc.Failed()
	case "postgres", "redis", "floor":
		var (
			st  benchStore
			err error
		)
		if *baseline == "floor" {
			st = newBenchFloorStore()
		} else if *baseline == "postgres" {
			st, err = openBenchPG(ctx, *pgDSN, *pgConns, *channel, false)
		} else {
			st, err = openBenchRedis(ctx, *redisAddr, 256, *prefix, false)
		}
		if err != nil {
			return err
		}
		b, err := serveBaseline(st)
		if err != nil {
			return errors.Join(err, st.close())
		}
		addr = b.addr
		stop = func(ctx context.Context) error { return errors.Join(b.shutdown(ctx), st.close()) }
	default:
		return fmt.Errorf("unknown baseline %q", *baseline)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = stop(context.Background())
		return err
	}
	psrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = psrv.Serve(ln) }()
	fmt.Printf("convlog-bench-child http=%s pprof=%s\n", addr, ln.Addr())
	var ferr error
	select {
	case <-ctx.Done():
	case ferr = <-failed: // nil channel for a baseline: never
	}
	_ = psrv.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	return errors.Join(ferr, stop(sctx))
}

// benchControl talks to the child's pprof and stats listener: no
// keep-alive, so no idle connection outlives a call.
var benchControl = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}

// benchChild is a running service process.
type benchChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
	pprof string
	waitc chan error
}

// startBenchChild runs `convlog-bench -child args...`: the service, or a
// baseline's server.
func startBenchChild(ctx context.Context, args []string) (*benchChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{"-child"}, args...)...)
	cmd.Env = append(os.Environ(), benchChildEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &benchChild{cmd: cmd, stdin: stdin, waitc: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { c.waitc <- cmd.Wait() }()
	fail := func(err error) (*benchChild, error) {
		_ = cmd.Process.Kill()
		<-c.waitc
		return nil, err
	}
	select {
	case line, ok := <-lines:
		if !ok {
			return fail(errors.New("bench child exited before it was ready"))
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "http="); ok {
				c.addr = v
			}
			if v, ok := strings.CutPrefix(f, "pprof="); ok {
				c.pprof = v
			}
		}
		if c.addr == "" {
			return fail(fmt.Errorf("bench child said %q", line))
		}
	case <-time.After(60 * time.Second):
		return fail(errors.New("bench child not ready after 60s"))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	return c, nil
}

func (c *benchChild) pid() int { return c.cmd.Process.Pid }

// stop ends the child gracefully (SIGTERM), then by force after 40s.
func (c *benchChild) stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.waitc:
		_ = c.stdin.Close()
		return err
	case <-time.After(40 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.waitc
		_ = c.stdin.Close()
		return errors.New("bench child did not stop within 40s of SIGTERM; killed")
	}
}

// rssKiB is the child's resident set (VmRSS) in KiB. It first asks the
// child for a garbage collection (the heap profile with gc=1) so that
// garbage does not count as memory in use.
func (c *benchChild) rssKiB(ctx context.Context) (int64, error) {
	if c.pprof != "" {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.pprof+"/debug/pprof/heap?gc=1", nil); err == nil {
			if resp, err := benchControl.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}
	return benchRSSKiB(c.pid())
}

func benchRSSKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmRSS")
}

// profile saves the child's CPU profile for d under path; it is meant to
// run alongside a scenario.
func (c *benchChild) profile(ctx context.Context, d time.Duration, path string) error {
	if c.pprof == "" {
		return errors.New("no pprof address")
	}
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", c.pprof, max(1, int(d.Seconds()))), nil)
	if err != nil {
		return err
	}
	resp, err := benchControl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: status %d", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// commitStats reads the log's group-commit counters.
func (c *benchChild) commitStats(ctx context.Context) (commits, writes uint64, err error) {
	return c.counters(ctx, "/debug/commits")
}

// streamWrites reads the SSE streams' socket writes and bytes.
func (c *benchChild) streamWrites(ctx context.Context) (writes, bytes uint64, err error) {
	return c.counters(ctx, "/debug/streams")
}

// counters reads a pair of counters the child serves at path.
func (c *benchChild) counters(ctx context.Context, path string) (a, b uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.pprof+path, nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := benchControl.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	_, err = fmt.Fscan(resp.Body, &a, &b)
	return a, b, err
}

// benchMem is the child's runtime memory.
type benchMem struct {
	heapInuse, stackInuse, sys uint64
	goroutines                 int
}

func (c *benchChild) memStats(ctx context.Context) (benchMem, error) {
	var m benchMem
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.pprof+"/debug/memstats", nil)
	if err != nil {
		return m, err
	}
	resp, err := benchControl.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	_, err = fmt.Fscan(resp.Body, &m.heapInuse, &m.stackInuse, &m.sys, &m.goroutines)
	return m, err
}

// fetch saves a pprof endpoint's answer (a heap profile, a trace).
func (c *benchChild) fetch(ctx context.Context, what, path string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.pprof+what, nil)
	if err != nil {
		return err
	}
	resp, err := benchControl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// benchRaiseFileLimit lifts the soft open-file limit to the hard one: ten
// thousand readers are ten thousand sockets on each side.
func benchRaiseFileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	return rl.Cur
}

// benchCPUSeconds is the user plus system CPU time a process has used.
func benchCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command (field 2) may hold spaces: count from its closing paren.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("bad /proc stat times")
	}
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}
