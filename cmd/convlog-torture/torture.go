package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
)

// tortureConfig is what `convlog torture` takes.
type tortureConfig struct {
	Cycles    int           // SIGKILLs of the service under load
	Clients   int           // posting goroutines
	Sessions  int           // sessions they post to, at random
	Readers   int           // SSE readers, round-robin over the sessions; 0 is one per session
	KillEvery time.Duration // mean time between kills; each is random in [d/2, 3d/2]

	// Auth runs the service with access control on and every request of
	// the torture with a bearer token.
	Auth bool

	NATSURL     string // an external broker the service uses (not restarted)
	NATSRestart bool   // run nats-server ourselves and SIGKILL/restart it between service cycles
	NATSServer  string // the nats-server binary for NATSRestart
	// BrokerLiveKills, with NATSRestart, also SIGKILLs the broker once in
	// each cycle while the service runs, and restarts it after up to 1s.
	BrokerLiveKills bool
	// NATSDown, with NATSRestart, restarts the broker this long after the
	// service in each cycle instead of before it: the service starts, and
	// must keep admitting, while its broker is down.
	NATSDown time.Duration
	// Cluster runs 3 nats-server nodes as a cluster (NATSServer is the
	// binary, 2.10 or later), `serve --workers=0` and 2 `convlog worker`
	// processes, and each cycle SIGKILLs a worker and the node leading the
	// submissions stream instead of the service.
	Cluster bool
	// LeaseTTL is the session lease TTL of the cluster mode's processes;
	// 0 is 10s.
	LeaseTTL time.Duration

	Data      string        // working folder; "" is a temp folder, removed after a passing run
	Bin       string        // the convlog binary; "" is this executable
	EchoDelay time.Duration // the echo agent's delay between words; 0 is 2ms, negative is none
	Words     int           // words per message: turns last about Words × EchoDelay per message they answer
	Seed      uint64        // 0 is time-based
	LogLevel  string        // the service's -log-level; "" is warn

	// ChangeEvery is the mean time between lifecycle changes (rewinds,
	// and every fourth a reset); each is random in [d/2, 3d/2]. Negative
	// disables them.
	ChangeEvery time.Duration

	SettleTimeout time.Duration // bound on waiting for every submission to settle at the end
	Log           io.Writer     // progress lines; nil discards them
}

func (c *tortureConfig) defaults() error {
	if c.Cycles < 0 || c.Clients <= 0 || c.Sessions <= 0 || c.Readers < 0 {
		return errors.New("torture: -cycles must be >= 0, -clients and -sessions > 0, -readers >= 0")
	}
	if c.KillEvery <= 0 {
		return errors.New("torture: -kill-every must be positive")
	}
	if (c.BrokerLiveKills || c.NATSDown != 0) && !c.NATSRestart {
		return errors.New("torture: -nats-live-kills and -nats-down need -nats-restart")
	}
	if c.NATSDown < 0 {
		return errors.New("torture: -nats-down must not be negative")
	}
	if c.Cluster && (c.NATSRestart || c.NATSURL != "") {
		return errors.New("torture: -cluster runs its own brokers; do not also give -nats or -nats-restart")
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.NATSRestart && c.NATSURL != "" {
		return errors.New("torture: -nats-restart runs its own broker; do not also give -nats")
	}
	switch {
	case c.EchoDelay == 0:
		c.EchoDelay = 2 * time.Millisecond
	case c.EchoDelay < 0:
		c.EchoDelay = 0
	}
	if c.Words <= 0 {
		c.Words = 1
	}
	if c.LogLevel == "" {
		c.LogLevel = "warn"
	}
	if c.Readers == 0 {
		c.Readers = c.Sessions
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.ChangeEvery == 0 {
		c.ChangeEvery = 300 * time.Millisecond
	}
	if c.SettleTimeout <= 0 {
		c.SettleTimeout = 2 * time.Minute
	}
	if c.NATSServer == "" {
		c.NATSServer = "nats-server"
	}
	if c.Bin == "" {
		bin, err := defaultConvlogBinary()
		if err != nil {
			return err
		}
		c.Bin = bin
	}
	return nil
}

func tortureCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("torture", flag.ContinueOnError)
	cfg := tortureConfig{Log: os.Stderr}
	fs.IntVar(&cfg.Cycles, "cycles", 5, "how many times to SIGKILL and restart the service under load")
	fs.IntVar(&cfg.Clients, "clients", 8, "concurrent posting clients")
	fs.IntVar(&cfg.Sessions, "sessions", 8, "sessions the clients post to (each post picks one at random)")
	fs.IntVar(&cfg.Readers, "readers", 0, "SSE readers tailing the sessions round-robin; 0 is one per session")
	fs.DurationVar(&cfg.KillEvery, "kill-every", 3*time.Second, "mean service uptime between kills; each is random in [d/2, 3d/2]")
	fs.StringVar(&cfg.NATSURL, "nats", "", "external NATS URL for the service (not restarted); empty runs NATS embedded in the service")
	fs.BoolVar(&cfg.Auth, "auth", false, "run the service with access control on (a static token with every verb) and send it on every request")
	fs.BoolVar(&cfg.NATSRestart, "nats-restart", false, "run nats-server as a second child on a free loopback port and SIGKILL/restart it between service cycles")
	fs.BoolVar(&cfg.BrokerLiveKills, "nats-live-kills", false, "with -nats-restart, also SIGKILL the broker once per cycle while the service runs (restarted after up to 1s)")
	fs.DurationVar(&cfg.NATSDown, "nats-down", 0, "with -nats-restart, restart the broker this long after the service in each cycle (the service starts with its broker down); 0 restarts it first")
	fs.StringVar(&cfg.NATSServer, "nats-server", "nats-server", "the nats-server binary for -nats-restart and -cluster (2.10 or later for -cluster: go build github.com/nats-io/nats-server/v2)")
	fs.BoolVar(&cfg.Cluster, "cluster", false, "run 3 nats-server nodes as a cluster, serve --workers=0 and 2 convlog workers; each cycle SIGKILL a worker and the node leading the submissions stream")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 10*time.Second, "with -cluster, the session lease TTL of the service and workers")
	fs.StringVar(&cfg.Data, "data", "", "working folder (service data, broker store, child logs); empty is a temp folder, removed after a passing run")
	fs.StringVar(&cfg.Bin, "bin", "", "the convlog binary to torture; empty is convlog beside this program, else on PATH")
	fs.DurationVar(&cfg.EchoDelay, "echo-delay", 2*time.Millisecond, "the echo agent's delay between words (negative for none)")
	fs.IntVar(&cfg.Words, "words", 1, "words per message (\"c3-17 w w w\"); the echo agent streams one per -echo-delay, so more words make longer turns for kills to interrupt")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed for kill times and session choice; 0 is time-based")
	fs.StringVar(&cfg.LogLevel, "log-level", "warn", "the service's -log-level (its log is service.log in the working folder)")
	fs.DurationVar(&cfg.ChangeEvery, "change-every", 300*time.Millisecond, "mean time between lifecycle changes: rewinds of random sessions and, every fourth change, a reset; negative for none")
	fs.DurationVar(&cfg.SettleTimeout, "settle-timeout", 2*time.Minute, "bound on waiting, at the end, for every admitted submission to settle")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("torture: unexpected arguments %q", fs.Args())
	}
	rep, err := runTorture(ctx, cfg)
	if rep != nil {
		fmt.Println(rep.Table())
	}
	if err != nil {
		return err
	}
	if p := rep.Problems(); len(p) > 0 {
		return fmt.Errorf("torture failed: %s", strings.Join(p, "; "))
	}
	return nil
}

// The agent and the names the torture posts under.
const tortureAgent = "echo"

// torture is one run.
type torture struct {
	cfg        tortureConfig
	out        io.Writer
	dir        string
	instance   string
	ns         string
	base       string // http://127.0.0.1:port
	svcArgs    []string
	natsURL    string
	brokerBin  string
	brokerArgs []string
	sessions   []string

	hc     *http.Client // no timeout: streams and long polls; requests carry contexts
	tr     *http.Transport
	client *client.Client

	svcMu        sync.Mutex    // held to restart the service after the kill cycles
	svc          *tortureChild // the current service process
	broker       *tortureChild // the current broker process, with NATSRestart
	brokerWanted bool          // the broker should be up (not in a planned outage)

	cluster *tortureCluster // with Cluster

	mu         sync.Mutex
	admissions map[string]*tortureAdmission // by submission id
	byText     map[string]string            // text -> first submission id
	tally      tortureTally

	readers []*tortureReader
	rep     *tortureReport

	// Lifecycle changes (torture_changes.go): sessionLocks keep posters
	// off a session being reset; the rest is under mu.
	sessionLocks   map[string]*sync.RWMutex
	rewinds        []tortureRewind
	resets         []tortureReset
	changeProblems []string
}

// runTorture runs the whole test: start, load and kill, settle, verify. The
// report is returned whenever the load started, with or without an error;
// the error is for the harness itself failing (a child would not start, the
// context ended), not for what the verification found: see Problems.
func runTorture(ctx context.Context, cfg tortureConfig) (_ *tortureReport, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	t := &torture{
		cfg: cfg, out: tortureProgress(cfg.Log),
		admissions: map[string]*tortureAdmission{}, byText: map[string]string{},
	}
	t.rep = &tortureReport{Config: cfg, Started: time.Now()}
	dir := cfg.Data
	removeDir := false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "convlog-torture-"); err != nil {
			return nil, err
		}
		removeDir = true
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	t.dir = dir
	t.rep.Dir = dir
	defer func() {
		// Every exit path: no child outlives the run.
		t.killChildren()
		if t.tr != nil {
			t.tr.CloseIdleConnections()
		}
		if !t.rep.Verified {
			// What is known without the verification.
			t.mu.Lock()
			t.rep.Admitted = len(t.admissions)
			t.rep.countLoad(t.tally, t.readers)
			t.mu.Unlock()
		}
		t.rep.Duration = time.Since(t.rep.Started)
		if removeDir && err == nil && len(t.rep.Problems()) == 0 {
			os.RemoveAll(dir)
			t.rep.Dir = ""
		}
	}()

	now := time.Now()
	t.instance = fmt.Sprintf("torture-%d", now.UnixNano())
	t.ns = fmt.Sprintf("torture-%d", now.UnixNano()%1e12)
	for i := range cfg.Sessions {
		t.sessions = append(t.sessions, fmt.Sprintf("s%d", i))
	}
	t.sessionLocks = newSessionLocks(t.sessions)
	t.tr = &http.Transport{
		MaxIdleConns:        cfg.Clients + cfg.Readers + 32,
		MaxIdleConnsPerHost: cfg.Clients + cfg.Readers + 32,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	t.hc = &http.Client{Transport: t.tr}
	var authConfig string
	if cfg.Auth {
		var token string
		if authConfig, token, err = writeAuthConfig(dir); err != nil {
			return nil, err
		}
		t.hc.Transport = bearer{token: token, next: t.tr}
	}
	port, err := tortureFreePort()
	if err != nil {
		return nil, err
	}
	t.base = fmt.Sprintf("http://127.0.0.1:%d", port)
	t.client = &client.Client{BaseURL: t.base, HTTP: t.hc}
	t.svcArgs = []string{"serve",
		"--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--data", filepath.Join(dir, "service"),
		"--echo-delay", cfg.EchoDelay.String(),
		"--shutdown-timeout", "2s",
		"--log-level", cfg.LogLevel,
		"--nats-namespace", t.ns,
	}
	if authConfig != "" {
		t.svcArgs = append(t.svcArgs, "--config", authConfig)
	}
	switch {
	case cfg.Cluster:
		if t.brokerBin, err = tortureLookNATSServer(cfg.NATSServer); err != nil {
			return nil, fmt.Errorf("torture: -cluster: %w", err)
		}
		if err := t.setupCluster(); err != nil {
			return nil, err
		}
	case cfg.NATSRestart:
		if t.brokerBin, err = tortureLookNATSServer(cfg.NATSServer); err != nil {
			return nil, fmt.Errorf("torture: -nats-restart: %w", err)
		}
		bport, err := tortureFreePort()
		if err != nil {
			return nil, err
		}
		t.natsURL = fmt.Sprintf("nats://127.0.0.1:%d", bport)
		t.brokerArgs = tortureBrokerArgs(bport, filepath.Join(dir, "nats"))
		t.svcArgs = append(t.svcArgs, "--nats", t.natsURL)
		t.rep.Broker = "nats-server " + t.natsURL + ", SIGKILLed and restarted every cycle"
	case cfg.NATSURL != "":
		t.natsURL = cfg.NATSURL
		t.svcArgs = append(t.svcArgs, "--nats", cfg.NATSURL)
		t.rep.Broker = "external " + cfg.NATSURL + " (not restarted)"
	default:
		t.rep.Broker = "embedded in the service"
	}
	t.logf("torture: %s; %d cycles, %d clients, %d sessions, %d readers, kill every ~%s, a change every ~%s, seed %d",
		t.rep.Broker, cfg.Cycles, cfg.Clients, cfg.Sessions, cfg.Readers, cfg.KillEvery, cfg.ChangeEvery, cfg.Seed)
	t.logf("torture: working folder %s (service log: service.log)", dir)

	if cfg.NATSRestart {
		if err := t.startBroker(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.Cluster {
		if err := t.startCluster(ctx); err != nil {
			return nil, err
		}
	}
	if err := t.startService(ctx); err != nil {
		return nil, err
	}
	if cfg.Cluster {
		if err := t.startWorkers(); err != nil {
			return nil, err
		}
	}
	return t.rep, t.run(ctx)
}

func (t *torture) logf(format string, args ...any) {
	fmt.Fprintf(t.out, format+"\n", args...)
}

func (t *torture) startService(ctx context.Context) error {
	t.rep.ServiceStarts++
	c, err := startTortureChild("service", t.cfg.Bin, t.svcArgs, filepath.Join(t.dir, "service.log"))
	if err != nil {
		return err
	}
	t.svc = c
	if err := tortureWaitHealthy(ctx, t.hc, c, t.base, 60*time.Second); err != nil {
		return err
	}
	if t.cfg.Auth {
		return t.checkAuthOn(ctx)
	}
	return nil
}

func (t *torture) startBroker(ctx context.Context) error {
	t.rep.BrokerStarts++
	c, err := startTortureChild("nats-server", t.brokerBin, t.brokerArgs, filepath.Join(t.dir, "nats.log"))
	if err != nil {
		return err
	}
	t.broker, t.brokerWanted = c, true
	return tortureWaitJetStream(ctx, c, t.natsURL, 60*time.Second)
}

// killBroker SIGKILLs the broker; it stays down until startBroker.
func (t *torture) killBroker() error {
	t.brokerWanted = false
	return t.broker.kill()
}

func (t *torture) killChildren() {
	children := []*tortureChild{t.svc, t.broker}
	if t.cluster != nil {
		children = append(append(children, t.cluster.workers...), t.cluster.nodes...)
	}
	for _, c := range children {
		if c != nil && !c.exited() {
			_ = c.kill()
		}
	}
}

// run is the load, the kills and the verification.
func (t *torture) run(ctx context.Context) error {
	cfg := t.cfg
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x70727475))

	// Readers live until the verification has compared their view with
	// the log; posters until told to stop and their last request is
	// resolved.
	readCtx, stopReaders := context.WithCancel(ctx)
	var readersWG sync.WaitGroup
	for i := range cfg.Readers {
		r := &tortureReader{t: t, id: i, session: t.sessions[i%len(t.sessions)], expected: record.Start}
		t.readers = append(t.readers, r)
		readersWG.Add(1)
		go func() { defer readersWG.Done(); r.run(readCtx) }()
	}
	defer func() { stopReaders(); readersWG.Wait() }()

	// Posters stop starting new requests when stopPosting closes; a
	// request they started they retry until it is answered, which after
	// the last kill only the final restart can do, or until resolveCtx
	// ends.
	stopPosting := make(chan struct{})
	resolveCtx, abandon := context.WithCancel(ctx)
	defer abandon()
	var postersWG sync.WaitGroup
	for i := range cfg.Clients {
		postersWG.Add(1)
		go func() {
			defer postersWG.Done()
			t.poster(resolveCtx, stopPosting, i)
		}()
	}
	if cfg.ChangeEvery > 0 {
		postersWG.Add(1)
		go func() {
			defer postersWG.Done()
			t.changer(resolveCtx, stopPosting)
		}()
	}
	posting := true
	stop := func() {
		if posting {
			close(stopPosting)
			posting = false
		}
	}
	defer func() { stop(); abandon(); postersWG.Wait() }()

	// The kill cycles.
	loadStart := time.Now()
	for t.rep.Cycles < cfg.Cycles {
		up := cfg.KillEvery/2 + time.Duration(rng.Int64N(int64(cfg.KillEvery)+1))
		if err := t.runFor(ctx, up, rng); err != nil {
			return err
		}
		if cfg.Cluster {
			if err := t.clusterKill(ctx); err != nil {
				return err
			}
			t.rep.Cycles++
			continue
		}
		before := t.admittedCount()
		if err := t.svc.kill(); err != nil {
			return err
		}
		t.rep.Cycles++
		killedAt := time.Now()
		if cfg.NATSRestart {
			if err := t.killBroker(); err != nil {
				return err
			}
			t.rep.BrokerKills++
			if cfg.NATSDown == 0 {
				if err := t.startBroker(ctx); err != nil {
					return err
				}
			}
		}
		if err := t.startService(ctx); err != nil {
			return err
		}
		t.logf("cycle %d/%d: SIGKILL after %s up (%d admitted so far); back in %s",
			t.rep.Cycles, cfg.Cycles, up.Round(time.Millisecond), before, time.Since(killedAt).Round(time.Millisecond))
		if cfg.NATSRestart && cfg.NATSDown > 0 {
			// The service runs, and admits, without its broker.
			t.logf("cycle %d/%d: broker down for %s under the restarted service", t.rep.Cycles, cfg.Cycles, cfg.NATSDown)
			if err := t.watch(ctx, cfg.NATSDown); err != nil {
				return err
			}
			if err := t.startBroker(ctx); err != nil {
				return err
			}
		}
	}
	// No kills at all (-cycles 0): still give the load a kill period.
	if cfg.Cycles == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cfg.KillEvery):
		}
	}
	t.rep.LoadDuration = time.Since(loadStart)

	// Stop posting; let every request in flight be answered by the service
	// that is now up.
	stop()
	t.logf("torture: stopped posting after %s; resolving requests in flight", t.rep.LoadDuration.Round(time.Millisecond))
	resolved := make(chan struct{})
	go func() { postersWG.Wait(); close(resolved) }()
	giveUp := time.NewTimer(90 * time.Second)
	defer giveUp.Stop()
resolving:
	for {
		select {
		case <-resolved:
			break resolving
		case <-t.svc.done:
			if err := t.unexpectedExit(ctx); err != nil {
				return err
			}
		case <-giveUp.C:
			abandon()
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	// Wait for every admission to settle, then read the log and compare.
	t.logf("torture: %d admitted; waiting (at most %s) for every submission to settle", t.admittedCount(), cfg.SettleTimeout)
	statuses, err := t.settleAll(ctx)
	if err != nil {
		return err
	}
	t.logf("torture: reading every session from offset 0")
	logs, err := t.readAll(ctx)
	if err != nil {
		return err
	}
	t.waitReaders(ctx, logs, 30*time.Second)
	stopReaders()
	readersWG.Wait()

	if t.cluster != nil {
		// The workers first: a worker's last writes go to the service,
		// which must still answer them.
		t.stopClusterWorkers()
	}
	if t.svc.exited() {
		if !t.svc.killed.Load() {
			t.rep.UnexpectedExits++
			t.rep.ExitNotes = append(t.rep.ExitNotes, t.svc.describeExit())
		}
	} else {
		// Our idle keep-alive connections first: net/http's Shutdown
		// waits up to 5s for a connection that never sent a request.
		t.tr.CloseIdleConnections()
		took, err := t.svc.stop(20 * time.Second)
		t.rep.FinalStop = fmt.Sprintf("SIGTERM: stopped in %s", took.Round(time.Millisecond))
		if err != nil {
			t.rep.FinalStopFailed = 1
			t.rep.FinalStop = fmt.Sprintf("SIGTERM: %v after %s", err, took.Round(time.Millisecond))
			t.rep.sample("final stop: %v; last lines of service.log:\n%s", err, tortureTail(t.svc.logPath, 10))
		}
	}
	if t.cluster != nil {
		t.stopClusterNodes()
	}
	if cfg.NATSURL != "" {
		// A broker we do not own: leave nothing of ours on it.
		if err := tortureCleanupBroker(ctx, cfg.NATSURL, t.ns); err != nil {
			t.logf("torture: cleaning namespace %s off %s: %v", t.ns, cfg.NATSURL, err)
		}
	}
	t.mu.Lock()
	in := tortureVerifyInput{
		Admissions: t.admissions, Statuses: statuses, Logs: logs,
		Readers: t.readers, Tally: t.tally,
		Rewinds: t.rewinds, Resets: t.resets, ChangeProblems: t.changeProblems,
	}
	t.rep.verify(in)
	t.mu.Unlock()
	t.rep.Duration = time.Since(t.rep.Started)
	return nil
}

// runFor lets the service run under load for d. With BrokerLiveKills the
// broker is SIGKILLed once meanwhile, at a random moment in the first
// half, and restarted after a random outage of up to a second, under the
// running service.
func (t *torture) runFor(ctx context.Context, d time.Duration, rng *rand.Rand) error {
	end := time.Now().Add(d)
	if t.cfg.NATSRestart && t.cfg.BrokerLiveKills {
		if err := t.watch(ctx, time.Duration(rng.Int64N(int64(d)/2+1))); err != nil {
			return err
		}
		if err := t.killBroker(); err != nil {
			return err
		}
		t.rep.BrokerLiveKills++
		if err := t.watch(ctx, time.Duration(rng.Int64N(int64(time.Second)))); err != nil {
			return err
		}
		if err := t.startBroker(ctx); err != nil {
			return err
		}
	}
	return t.watch(ctx, time.Until(end))
}

// watch waits d while the service runs, recording and restarting it
// whenever it exits by itself.
func (t *torture) watch(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(max(d, 0))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.svc.done:
			if err := t.unexpectedExit(ctx); err != nil {
				return err
			}
		case <-timer.C:
			return nil
		}
	}
}

// unexpectedExit records a service exit the torture did not cause and
// restarts it. Too many of them end the run.
func (t *torture) unexpectedExit(ctx context.Context) error {
	t.svc.killed.Store(true) // counted once
	t.rep.UnexpectedExits++
	note := t.svc.describeExit()
	t.rep.ExitNotes = append(t.rep.ExitNotes, note)
	t.logf("torture: UNEXPECTED: %s", note)
	if t.rep.UnexpectedExits >= 10 {
		return errors.New("torture: the service exited by itself 10 times; giving up")
	}
	if t.cfg.NATSRestart && t.brokerWanted && t.broker.exited() {
		if err := t.startBroker(ctx); err != nil {
			return err
		}
	}
	return t.startService(ctx)
}

func (t *torture) admittedCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.admissions)
}

// defaultConvlogBinary is the convlog binary beside this program (as `make
// build` lays them out in bin/), else the one on PATH.
func defaultConvlogBinary() (string, error) {
	if exe, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(exe), "convlog")
		if st, err := os.Stat(beside); err == nil && !st.IsDir() {
			return beside, nil
		}
	}
	bin, err := exec.LookPath("convlog")
	if err != nil {
		return "", fmt.Errorf("torture: no convlog binary beside this program or on PATH (give -bin): %w", err)
	}
	return bin, nil
}
