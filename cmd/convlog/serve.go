package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/convlog/convlog/internal/config"
	"github.com/convlog/convlog/internal/service"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/natsbus"
)

func serveCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := service.Config{}
	fs.StringVar(&cfg.Listen, "listen", service.DefaultListen, "HTTP listen address")
	fs.StringVar(&cfg.Data, "data", service.DefaultData, "data folder: the bbolt log and the embedded JetStream store")
	fs.StringVar(&cfg.NATSURL, "nats", "", "external NATS URL (e.g. nats://127.0.0.1:4222); empty runs NATS embedded")
	fs.StringVar(&cfg.NATSListen, "nats-listen", "", "embedded NATS TCP address (e.g. 127.0.0.1:4222); empty for in-process only")
	workerPasswordFile := fs.String("nats-worker-password-file", "", "file holding the password remote workers give the embedded NATS as user \"worker\" (or set "+envNATSWorkerPassword+"); required with --nats-listen beyond loopback, or with auth on")
	fs.StringVar(&cfg.NATSTLSCert, "nats-tls-cert", "", "PEM certificate of the embedded NATS's port (TLS; required with --nats-listen beyond loopback)")
	fs.StringVar(&cfg.NATSTLSKey, "nats-tls-key", "", "PEM private key of --nats-tls-cert")
	natsClient := addNATSClientFlags(fs, "")
	fs.StringVar(&cfg.NATSNamespace, "nats-namespace", string(natsbus.DefaultNamespace), "prefix of the NATS subjects, stream and consumer, so deployments can share a broker")
	fs.Int64Var(&cfg.MaxBody, "max-body", transport.DefaultMaxBody, "largest request body in bytes")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", transport.DefaultHeartbeat, "SSE keepalive period")
	fs.DurationVar(&cfg.SSEWriteTimeout, "write-timeout", transport.DefaultWriteTimeout, "a response not taken within this (from its start; per write for SSE) is dropped: a dead or stalled reader")
	fs.DurationVar(&cfg.SSEWriteTimeout, "sse-write-timeout", transport.DefaultWriteTimeout, "the same as -write-timeout (its former name)")
	fs.DurationVar(&cfg.BodyReadTimeout, "body-read-timeout", transport.DefaultBodyReadTimeout, "a request body that takes longer to arrive is refused 408 request_timeout")
	fs.Int64Var(&cfg.BodyBudget, "body-budget", 0, "request body bytes held at once over all requests; over it 503 overloaded (0: 16 × -max-body)")
	fs.Int64Var(&cfg.PageBudget, "page-budget", transport.DefaultPageBudget, "JSON page bytes being written at once; over it 503 overloaded")
	fs.IntVar(&cfg.SSEPageBytes, "sse-page-bytes", transport.DefaultStreamPageBytes, "bytes of records an SSE stream reads and holds at a time (a larger batch is still read whole)")
	fs.IntVar(&cfg.MaxStreams, "max-streams", 0, "open SSE streams at most; over it 503 too_many_streams (0: the open-file limit less a reserve of 1/8, 256 to 8192)")
	fs.IntVar(&cfg.SSEMaxLag, "sse-max-lag", transport.DefaultMaxLag, "records a live SSE reader may fall behind the tail before it is told to resume later")
	fs.DurationVar(&cfg.EchoDelay, "echo-delay", service.DefaultEchoDelay, "the echo agent's delay between words")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", service.DefaultShutdownTimeout, "how long running turns may finish on SIGTERM before they are settled interrupted")
	cfg.BusyPolicies = map[string]string{}
	fs.Func("busy-policy", "agent=join|queue|reject|interrupt: what a delivery to a busy session gets (repeatable; default join; enqueue is join)", func(v string) error {
		name, policy, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want agent=policy, got %q", v)
		}
		p, err := worker.ParseBusyPolicy(policy)
		if err != nil {
			return err
		}
		cfg.BusyPolicies[name] = string(p)
		return nil
	})
	configPath := fs.String("config", "", "convlog.yaml: the agents to serve (docs/agents.md); without it, the built-in echo")
	fs.Func("cors-origin", "a browser origin allowed to call the API, or * for any (repeatable; default none)", func(v string) error {
		cfg.CORSOrigins = append(cfg.CORSOrigins, v)
		return nil
	})
	workers := fs.Int("workers", 1, "1 runs the agents in this process; 0 runs none (API and log only), for remote `convlog worker` processes on the same NATS")
	fs.IntVar(&cfg.NATSReplicas, "nats-replicas", 1, "servers of the NATS cluster that keep the submissions stream and the lease bucket (3 for a 3-node cluster)")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", natsbus.DefaultLeaseTTL, "how long a dead worker's session lease lasts (every worker must use the same)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "allow a non-loopback --listen without access control (anyone who reaches the port can read and write every conversation)")
	fs.StringVar(&cfg.A2ADefaultAgent, "a2a-default-agent", "", "the agent whose A2A card is also served at /.well-known/agent-card.json (default none)")
	fs.BoolVar(&cfg.Init, "init", false, "start an empty log (or JetStream store) in a data folder that holds only part of a deployment: an empty convlog.db, a log without its jetstream/ store or the reverse")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	pprofListen := fs.String("pprof-listen", "", "serve runtime profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:6060; empty for none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.NATSWorkerPassword, err = workerPassword(*workerPasswordFile); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if cfg.NATSCredentials, err = natsClient.credentials(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	switch *workers {
	case 0:
		cfg.NoWorkers = true
	case 1:
	default:
		return fmt.Errorf("serve: --workers is 0 or 1 (more agents: start `convlog worker` processes)")
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("serve: -log-level: %w", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	if *configPath != "" {
		f, err := config.Load(*configPath)
		if err != nil {
			return err // one line: file, line, field
		}
		cfg.Agents, cfg.Auth = f, f.Auth
	}

	if *pprofListen != "" {
		stopPprof, err := servePprof(*pprofListen, cfg.Logger)
		if err != nil {
			return fmt.Errorf("serve: --pprof-listen: %w", err)
		}
		defer stopPprof()
	}
	svc, err := service.Start(cfg)
	if err != nil {
		return err
	}
	var failed error
	select {
	case <-ctx.Done():
		cfg.Logger.Info("convlog stopping", "shutdown-timeout", cfg.ShutdownTimeout)
	case failed = <-svc.Failed():
		cfg.Logger.Error("convlog stopping after a failure", "err", failed)
	}
	if err := svc.Stop(context.Background()); err != nil {
		return err
	}
	if failed != nil {
		return failed
	}
	cfg.Logger.Info("convlog stopped")
	return nil
}
