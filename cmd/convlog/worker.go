package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/convlog/convlog/internal/config"
	"github.com/convlog/convlog/internal/service"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
	"github.com/convlog/convlog/worker/remote"
)

// errNATSClosed: the worker's NATS client gave up its connection.
var errNATSClosed = errors.New("nats connection closed")

// workerCommand runs agents in this process for a `convlog serve
// --workers=0` elsewhere: submissions from JetStream, leases in its KV
// bucket, deltas on core subjects, and the log through its owner.
func workerCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	url := fs.String("nats", "", "NATS URL, or a comma-separated list of a cluster's URLs (required)")
	ns := fs.String("nats-namespace", "convlog", "the service's --nats-namespace")
	replicas := fs.Int("nats-replicas", 1, "the service's --nats-replicas")
	leaseTTL := fs.Duration("lease-ttl", 15*time.Second, "the service's --lease-ttl")
	echoDelay := fs.Duration("echo-delay", 20*time.Millisecond, "the echo agent's delay between words")
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "how long running turns may finish on SIGTERM before they are settled interrupted")
	sweep := fs.Duration("sweep-interval", 10*time.Second, "how often to look in the log for admitted work whose doorbell was lost and for turns of dead workers")
	busy := map[string]string{}
	fs.Func("busy-policy", "agent=join|queue|reject|interrupt (repeatable; as the service's)", func(v string) error {
		name, policy, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want agent=policy, got %q", v)
		}
		p, err := worker.ParseBusyPolicy(policy)
		if err != nil {
			return err
		}
		busy[name] = string(p)
		return nil
	})
	natsClient := addNATSClientFlags(fs, natsbus.WorkerUser)
	configPath := fs.String("config", "", "convlog.yaml: the agents to run, as the service's (docs/agents.md); without it, the built-in echo")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("worker: unexpected arguments %q", fs.Args())
	}
	if *url == "" {
		return errors.New("worker: --nats is required")
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("worker: -log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	namespace := natsbus.Namespace(*ns)
	if err := namespace.Validate(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}

	var file *config.File
	if *configPath != "" {
		f, err := config.Load(*configPath)
		if err != nil {
			return err // one line: file, line, field
		}
		file = f
	}
	creds, err := natsClient.credentials()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	nc, err := natsbus.ConnectWith(*url, creds, true, logger)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer nc.Close()
	// The client gives up (closes) only on what retrying does not mend,
	// refused credentials above all: the worker then stops and says why,
	// rather than wait forever on a dead connection.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	nc.SetClosedHandler(func(c *nats.Conn) {
		stop(fmt.Errorf("%w: %v", errNATSClosed, c.LastError()))
	})
	bus, err := natsbus.NewDeltaPublisher(nc, namespace)
	if err != nil {
		return err
	}
	lg, err := remote.NewClient(remote.ClientConfig{NATS: nc, Namespace: namespace, Logger: logger})
	if err != nil {
		return err
	}
	agents := pool.NewRegistry()
	if err := service.RegisterAgents(file, busy, *echoDelay, agents, lg, logger); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	p, err := pool.NewPool(pool.Config{
		Log: lg, NATS: nc, Agents: agents, Deltas: bus, Logger: logger,
		Namespace: namespace, ShutdownTimeout: *shutdown, LeaseTTL: *leaseTTL,
		SweepInterval: *sweep, Replicas: *replicas, Remote: true,
	})
	if err != nil {
		return err
	}
	logger.Info("convlog worker running", "id", lg.InstanceID(), "nats", *url, "namespace", *ns)
	// Aborts are answered until the pool has drained its turns.
	abortCtx, stopAborts := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := remote.ServeAborts(abortCtx, nc, namespace, p); err != nil {
			logger.Error("worker: aborts", "err", err)
		}
	}()
	err = p.Run(ctx)
	stopAborts()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if cause := context.Cause(ctx); errors.Is(cause, errNATSClosed) {
		return fmt.Errorf("worker: %w", cause)
	}
	logger.Info("convlog worker stopped")
	return nil
}
