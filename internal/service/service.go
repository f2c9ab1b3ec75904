// Package service wires convlog together in one process: the log, NATS
// (embedded or external), the relay, the worker pool and the HTTP server.
// `convlog serve`, the tests, the benchmark and the torture harness start
// it through Start and drive it through its methods, never its fields.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/internal/config"
	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/internal/datadir"
	"github.com/convlog/convlog/internal/fdlimit"
	"github.com/convlog/convlog/internal/metrics"
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
	"github.com/convlog/convlog/worker/remote"
)

// Config is what `convlog serve` takes.
type Config struct {
	Listen        string // HTTP address
	Data          string // folder of the log and the embedded JetStream store
	NATSURL       string // external NATS; "" runs NATS embedded
	NATSListen    string // embedded NATS's TCP address; "" for none
	NATSNamespace string // prefix of every NATS name; "" for "convlog"
	// NATSWorkerPassword lets remote workers into the embedded broker's
	// TCP port as natsbus.WorkerUser, with only a worker's subjects; with
	// it every connection to the port must authenticate. Required for a
	// port beyond loopback, and for any port when Auth is on.
	NATSWorkerPassword string
	// NATSTLSCert and NATSTLSKey (PEM files) make the embedded broker's
	// port speak TLS only. Required for a port beyond loopback.
	NATSTLSCert, NATSTLSKey string
	// NATSCredentials are presented to an external NATS (NATSURL).
	NATSCredentials natsbus.Credentials
	MaxBody         int64         // request body limit
	Heartbeat       time.Duration // SSE keepalive period
	SSEWriteTimeout time.Duration // a response (or stream write) that takes longer is dropped
	BodyReadTimeout time.Duration // a request body that takes longer to arrive is 408
	BodyBudget      int64         // request body bytes in flight at once; 0 for 16 × MaxBody
	PageBudget      int64         // JSON page bytes being written at once; 0 for the default
	SSEPageBytes    int           // bytes of records an SSE stream reads at a time; 0 for the default
	MaxStreams      int           // open SSE streams; 0 derives it from the descriptor limit
	SSEMaxLag       int           // records a live SSE reader may fall behind
	EchoDelay       time.Duration // the echo agent's delay between words
	ShutdownTimeout time.Duration // how long running turns may finish on stop
	// CORSOrigins are the browser origins allowed to call the API.
	CORSOrigins []string
	// A2ADefaultAgent is the agent whose A2A card is served at
	// /.well-known/agent-card.json; "" for none.
	A2ADefaultAgent string
	// BusyPolicies maps an agent name to its busy policy (join, queue,
	// reject, interrupt; enqueue is join): what a delivery to a session
	// with unsettled work gets. It overrides the config file's.
	BusyPolicies map[string]string
	// Auth is access control (the config file's auth section); nil or
	// empty serves everyone, which Start allows only on loopback unless
	// Insecure is set.
	Auth     *auth.Config
	Insecure bool
	// Agents are the agents of the config file; nil serves echo alone.
	Agents *config.File
	// Init lets the service start on a data folder that holds part of a
	// deployment (an empty log file, a log without its JetStream store or
	// the reverse) by starting an empty log or store. A new folder needs
	// no Init.
	Init bool
	// NoWorkers runs no agents in this process (`serve --workers=0`): the
	// API and the log only, answering the log requests of remote workers
	// (`convlog worker`) over NATS.
	NoWorkers bool
	// NATSReplicas is how many servers of a NATS cluster keep the
	// submissions stream and the lease bucket; 0 is 1.
	NATSReplicas int
	// LeaseTTL is the session leases' TTL (the workers' must match); 0 is
	// natsbus.DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Linger is how long an idle in-process runner keeps its session's
	// lease for the next message; 0 is pool.DefaultLinger.
	Linger time.Duration
	// SweepInterval is how often the in-process workers look in the log
	// for work whose doorbell was lost; 0 is the pool's default (10 s).
	SweepInterval time.Duration
	Logger        *slog.Logger
}

// Service is convlog wired together in one process.
type Service struct {
	cfg    Config
	logger *slog.Logger

	dir   *datadir.Folder
	db    *clog.DB
	emb   *natsbus.Embedded
	nc    *nats.Conn
	bus   *natsbus.DeltaBus
	relay *natsbus.Relay
	conv  *conversation.Core
	pool  *pool.Pool     // nil with NoWorkers
	owner *remote.Server // the remote workers' log, with NoWorkers
	http  *transport.Server
	ln    net.Listener

	auth    *auth.Authenticator // nil without access control
	metrics *metrics.Metrics

	cancel context.CancelFunc // stops relay, pool and sweeper
	wg     sync.WaitGroup     // relay, pool, sweeper
	httpWG sync.WaitGroup     // the HTTP server, which outlives them on Stop
	errs   chan error
}

// Start opens the log, starts or connects to NATS, and starts the workers
// and the HTTP server. The service runs until Stop.
func Start(cfg Config) (_ *Service, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := checkExposure(cfg); err != nil {
		return nil, err
	}
	// Every stream holds a descriptor: take all the system allows, and cap
	// the streams below it so that the rest always has some.
	nofile, ferr := fdlimit.Raise()
	if ferr != nil {
		cfg.Logger.Warn("could not raise the open-file limit to its hard limit", "nofile", nofile, "err", ferr)
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = fdlimit.DefaultMaxStreams(nofile)
	}
	cfg.Logger.Info("descriptor limits", "nofile", nofile, "max-streams", cfg.MaxStreams)
	s := &Service{cfg: cfg, logger: cfg.Logger, errs: make(chan error, 4)}
	defer func() {
		if err != nil {
			s.closeInfra()
		}
	}()
	// Ports first: a clash must leave no data folder behind.
	if s.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	s.metrics = metrics.New()
	if cfg.NATSURL == "" && cfg.NATSListen != "" {
		if err := portFree(cfg.NATSListen); err != nil {
			return nil, fmt.Errorf("nats listen %s: %w", cfg.NATSListen, err)
		}
	}
	if s.dir, err = datadir.Open(cfg.Data, cfg.NATSURL == "", cfg.Init); err != nil {
		return nil, err
	}
	// Where we serve, for the commands given only the folder (backup).
	if err := s.dir.Listening(s.ln.Addr().String()); err != nil {
		s.logger.Warn("recording the listen address in the data folder's lock", "err", err)
	}
	if s.db, err = clog.Open(s.dir.LogPath(), &clog.Options{Observer: s.metrics, Logger: s.logger, WakeDelay: transport.WakeDelay}); err != nil {
		return nil, err
	}
	if err := s.dir.CheckLog(s.db); err != nil {
		return nil, err
	}
	if cfg.NATSURL == "" {
		s.checkDisk()
		if s.emb, err = natsbus.StartEmbeddedWith(natsbus.EmbeddedOptions{
			Dir: s.dir.JetStreamPath(), Listen: cfg.NATSListen,
			Namespace:      natsbus.Namespace(cfg.NATSNamespace),
			WorkerPassword: cfg.NATSWorkerPassword,
			TLSCert:        cfg.NATSTLSCert, TLSKey: cfg.NATSTLSKey,
			// checkExposure has refused a port beyond loopback, or with
			// access control on, that would have no users.
			Open: cfg.NATSWorkerPassword == "",
		}); err != nil {
			return nil, err
		}
		if s.nc, err = s.emb.Connect(); err != nil {
			return nil, fmt.Errorf("connect embedded nats: %w", err)
		}
	} else if s.nc, err = natsbus.ConnectWith(cfg.NATSURL, cfg.NATSCredentials, false, s.logger); err != nil {
		return nil, err
	}

	agents := pool.NewRegistry()
	if err := registerAgents(cfg, agents, s.db, s.logger); err != nil {
		return nil, err
	}
	if s.bus, err = natsbus.NewDeltaBus(s.nc, natsbus.Namespace(cfg.NATSNamespace)); err != nil {
		return nil, err
	}
	s.bus.SetWakeDelay(transport.WakeDelay)
	if s.relay, err = natsbus.NewRelay(s.db, s.nc, natsbus.Namespace(cfg.NATSNamespace), s.logger); err != nil {
		return nil, err
	}
	// The runner of the turns: the pool here, or with NoWorkers the
	// remote workers' log owner, which aborts turns in other processes and
	// waits for their settlements.
	var runner conversation.Runner
	if cfg.NoWorkers {
		if s.owner, err = remote.NewServer(remote.ServerConfig{
			Log: s.db, NATS: s.nc, Namespace: natsbus.Namespace(cfg.NATSNamespace),
			Replicas: cfg.NATSReplicas, LeaseTTL: cfg.LeaseTTL, Logger: s.logger,
		}); err != nil {
			return nil, err
		}
		runner = s.owner
	} else {
		if s.pool, err = pool.NewPool(pool.Config{
			Log: s.db, NATS: s.nc, Agents: agents, Deltas: s.bus, Logger: s.logger,
			Namespace:       natsbus.Namespace(cfg.NATSNamespace),
			ShutdownTimeout: cfg.ShutdownTimeout,
			Observer:        s.metrics,
			Replicas:        cfg.NATSReplicas,
			LeaseTTL:        cfg.LeaseTTL,
			Linger:          cfg.Linger,
			SweepInterval:   cfg.SweepInterval,
		}); err != nil {
			return nil, err
		}
		runner = s.pool
	}
	if s.conv, err = conversation.New(conversation.Config{Log: s.db, Agents: agents, Runner: runner, Outbox: s.relay, Logger: s.logger}); err != nil {
		return nil, err
	}
	if cfg.Auth != nil && cfg.Auth.Enabled() {
		if s.auth, err = auth.New(context.Background(), *cfg.Auth, auth.Options{}); err != nil {
			return nil, fmt.Errorf("access control: %w", err)
		}
	}
	if s.http, err = transport.New(transport.Options{
		Log:           s.db,
		Conversations: s.conv,
		Deltas:        deltaSource{s.bus},
		Ready:         readiness{s},
		MaxBody:       cfg.MaxBody,
		Heartbeat:     cfg.Heartbeat,
		WriteTimeout:  cfg.SSEWriteTimeout,
		MaxLag:        cfg.SSEMaxLag,
		CORSOrigins:   cfg.CORSOrigins,
		Auth:          s.authenticator(),
		Limits:        authLimits(cfg.Auth),
		Logger:        s.logger,
		// The adapters' default A2A card.
		A2ADefaultAgent: cfg.A2ADefaultAgent,
		Observer:        s.metrics,
		Metrics:         s.metrics.Handler(),
		Backup:          s.db,

		BodyReadTimeout: cfg.BodyReadTimeout,
		BodyBudget:      cfg.BodyBudget,
		PageBudget:      cfg.PageBudget,
		StreamPageBytes: cfg.SSEPageBytes,
		MaxStreams:      cfg.MaxStreams,
	}); err != nil {
		return nil, err
	}
	running := func() (int, int) { return 0, 0 } // the turns run in remote workers
	if s.pool != nil {
		running = s.pool.Running
	}
	s.metrics.Watch(metrics.State{Backlog: s.db.Backlog, Running: running, Streams: s.http.OpenStreams, StreamWrites: s.http.StreamWrites, NATS: s.nc})

	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.goRun("relay", func() error { return s.relay.Run(ctx) })
	if s.pool != nil {
		s.goRun("pool", func() error { return s.pool.Run(ctx) })
	} else {
		s.goRun("remote workers' log", func() error { return s.owner.Run(ctx) })
	}
	s.goRun("idempotency sweeper", func() error { s.sweepIdempotency(ctx); return nil })
	if s.emb != nil {
		s.goRun("embedded broker watch", func() error { s.watchEmbedded(ctx); return nil })
	}
	s.goRunIn(&s.httpWG, "http", func() error {
		if err := s.http.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	s.logger.Info("convlog serving", "http", s.ln.Addr().String(), "data", cfg.Data, "nats", s.natsDescription())
	return s, nil
}

func (s *Service) goRun(name string, fn func() error) { s.goRunIn(&s.wg, name, fn) }

func (s *Service) goRunIn(wg *sync.WaitGroup, name string, fn func() error) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := fn(); err != nil {
			s.logger.Error(name+" stopped", "err", err)
			select {
			case s.errs <- fmt.Errorf("%s: %w", name, err):
			default:
			}
		}
	}()
}

func (s *Service) natsDescription() string {
	if s.emb != nil {
		if s.cfg.NATSListen != "" {
			return "embedded, listening on " + s.cfg.NATSListen
		}
		return "embedded (in-process only)"
	}
	return s.cfg.NATSURL
}

// Addr is the HTTP address the service listens on.
func (s *Service) Addr() string { return s.ln.Addr().String() }

// Failed delivers the first error of a component that stopped by itself.
func (s *Service) Failed() <-chan error { return s.errs }

// readiness is the service's /readyz condition.
type readiness struct{ s *Service }

func (r readiness) Ready() error { return r.s.ready() }

// ready is /readyz's condition besides the log being open: NATS connected
// and the outbox draining. Admission works without either (the log is the
// admission), so this is "degraded", not "down".
func (s *Service) ready() error {
	if err := s.storageReady(); err != nil {
		return err
	}
	workers := func() error {
		if s.pool == nil {
			return s.owner.Ready()
		}
		return s.pool.Ready()
	}
	if err := workers(); err != nil {
		return fmt.Errorf("degraded: %w; admissions are kept and relayed when it is back", err)
	}
	if err := s.relay.Healthy(); err != nil {
		return fmt.Errorf("degraded: %w%s", err, s.embeddedStoreHint())
	}
	return nil
}

func (s *Service) sweepIdempotency(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for {
				n, err := s.db.ExpireIdempotencyKeys(ctx, 1000)
				if err != nil || n < 1000 {
					break
				}
			}
		}
	}
}

// Stop shuts down gracefully: stop admitting (deliveries get 503
// shutting_down while reads and streams go on), let running turns finish
// up to the shutdown timeout (then they are settled interrupted), then end
// streams and HTTP, and close NATS and the log.
func (s *Service) Stop(ctx context.Context) error {
	s.http.StopAdmitting()
	s.cancel()
	s.wg.Wait() // relay, pool (its drain), sweeper
	var errs []error
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.http.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("http shutdown: %w", err))
	}
	s.httpWG.Wait()
	for done := false; !done; {
		select {
		case err := <-s.errs:
			errs = append(errs, err)
		default:
			done = true
		}
	}
	if err := s.closeInfra(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// closeInfra closes what Start opened, in reverse.
func (s *Service) closeInfra() error {
	var errs []error
	if s.auth != nil {
		s.auth.Close()
	}
	if s.bus != nil {
		if err := s.bus.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.emb != nil {
		s.emb.Shutdown()
	}
	if s.ln != nil && s.http == nil {
		s.ln.Close()
	}
	if s.db != nil {
		if err := s.db.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.dir != nil {
		if err := s.dir.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CommitStats reports the log's group-commit counters: commits and the
// writes they carried.
func (s *Service) CommitStats() (commits, writes uint64) { return s.db.CommitStats() }

// StreamWrites reports the SSE streams' socket writes and their bytes.
func (s *Service) StreamWrites() (writes, bytes uint64) { return s.http.StreamWrites() }
