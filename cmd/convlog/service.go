package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/worker"
)

// Config is what `convlog serve` takes.
type Config struct {
	Listen          string        // HTTP address
	Data            string        // folder of the log and the embedded JetStream store
	NATSURL         string        // external NATS; "" runs NATS embedded
	NATSListen      string        // embedded NATS's TCP address; "" for none
	NATSNamespace   string        // prefix of every NATS name; "" for "convlog"
	MaxBody         int64         // request body limit
	Heartbeat       time.Duration // SSE keepalive period
	SSEWriteTimeout time.Duration // a stream write that takes longer ends the stream
	SSEMaxLag       int           // records a live SSE reader may fall behind
	EchoDelay       time.Duration // the echo agent's delay between words
	ShutdownTimeout time.Duration // how long running turns may finish on stop
	// CORSOrigins are the browser origins allowed to call the API.
	CORSOrigins []string
	// BusyPolicies maps an agent name to "enqueue" (the default) or
	// "reject": what a delivery to a session with unsettled work gets.
	BusyPolicies map[string]string
	Logger       *slog.Logger
}

// Service is convlog wired together in one process.
type Service struct {
	cfg    Config
	logger *slog.Logger

	db    *clog.DB
	emb   *worker.Embedded
	nc    *nats.Conn
	bus   *worker.DeltaBus
	relay *worker.Relay
	pool  *worker.Pool
	http  *transport.Server
	ln    net.Listener

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
	s := &Service{cfg: cfg, logger: cfg.Logger, errs: make(chan error, 4)}
	defer func() {
		if err != nil {
			s.closeInfra()
		}
	}()
	if err := os.MkdirAll(cfg.Data, 0o755); err != nil {
		return nil, fmt.Errorf("data folder: %w", err)
	}
	if s.db, err = clog.Open(filepath.Join(cfg.Data, "convlog.db"), nil); err != nil {
		return nil, err
	}
	if cfg.NATSURL == "" {
		if s.emb, err = worker.StartEmbedded(filepath.Join(cfg.Data, "jetstream"), cfg.NATSListen); err != nil {
			return nil, err
		}
		if s.nc, err = s.emb.Connect(); err != nil {
			return nil, fmt.Errorf("connect embedded nats: %w", err)
		}
	} else if s.nc, err = worker.Connect(cfg.NATSURL); err != nil {
		return nil, err
	}

	agents := worker.NewRegistry()
	builtin := map[string]worker.Agent{"echo": worker.Echo{Delay: cfg.EchoDelay}}
	for name := range cfg.BusyPolicies {
		if builtin[name] == nil {
			return nil, fmt.Errorf("busy policy for %q: no such agent", name)
		}
	}
	for name, agent := range builtin {
		if err := agents.Register(name, agent, worker.BusyPolicy(cfg.BusyPolicies[name])); err != nil {
			return nil, err
		}
	}
	if s.bus, err = worker.NewDeltaBus(s.nc, worker.Namespace(cfg.NATSNamespace)); err != nil {
		return nil, err
	}
	if s.relay, err = worker.NewRelay(s.db, s.nc, worker.Namespace(cfg.NATSNamespace), s.logger); err != nil {
		return nil, err
	}
	if s.pool, err = worker.NewPool(worker.Config{
		Log: s.db, NATS: s.nc, Agents: agents, Deltas: s.bus, Logger: s.logger,
		Namespace:       worker.Namespace(cfg.NATSNamespace),
		ShutdownTimeout: cfg.ShutdownTimeout,
	}); err != nil {
		return nil, err
	}
	if s.http, err = transport.New(transport.Options{
		Log:          s.db,
		Agents:       agents,
		Deltas:       deltaSource{s.bus},
		Admitted:     func(clog.Submission) { s.relay.Kick() },
		Ready:        s.ready,
		Abort:        s.pool.Abort,
		Claim:        s.pool.Claim,
		MaxBody:      cfg.MaxBody,
		Heartbeat:    cfg.Heartbeat,
		WriteTimeout: cfg.SSEWriteTimeout,
		MaxLag:       cfg.SSEMaxLag,
		CORSOrigins:  cfg.CORSOrigins,
		Logger:       s.logger,
	}); err != nil {
		return nil, err
	}
	if s.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.goRun("relay", func() error { return s.relay.Run(ctx) })
	s.goRun("pool", func() error { return s.pool.Run(ctx) })
	s.goRun("idempotency sweeper", func() error { s.sweepIdempotency(ctx); return nil })
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

// ready is /readyz's condition besides the log being open: NATS connected
// and the outbox draining. Admission works without either (the log is the
// admission), so this is "degraded", not "down".
func (s *Service) ready() error {
	if err := s.pool.Ready(); err != nil {
		return fmt.Errorf("degraded: %w; admissions are kept and relayed when it is back", err)
	}
	if err := s.relay.Healthy(); err != nil {
		return fmt.Errorf("degraded: %w", err)
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
	return errors.Join(errs...)
}
