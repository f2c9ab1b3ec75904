package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
)

func serveCommand(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := Config{}
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "HTTP listen address")
	fs.StringVar(&cfg.Data, "data", "./data", "data folder: the bbolt log and the embedded JetStream store")
	fs.StringVar(&cfg.NATSURL, "nats", "", "external NATS URL (e.g. nats://127.0.0.1:4222); empty runs NATS embedded")
	fs.StringVar(&cfg.NATSListen, "nats-listen", "", "embedded NATS TCP address (e.g. 127.0.0.1:4222); empty for in-process only")
	fs.StringVar(&cfg.NATSNamespace, "nats-namespace", "convlog", "prefix of the NATS subjects, stream and consumer, so deployments can share a broker")
	fs.Int64Var(&cfg.MaxBody, "max-body", 8<<20, "largest request body in bytes")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", 15*time.Second, "SSE keepalive period")
	fs.DurationVar(&cfg.SSEWriteTimeout, "sse-write-timeout", 30*time.Second, "an SSE write that takes longer ends the stream (dead or stalled reader)")
	fs.IntVar(&cfg.SSEMaxLag, "sse-max-lag", 100000, "records a live SSE reader may fall behind the tail before it is told to resume later")
	fs.DurationVar(&cfg.EchoDelay, "echo-delay", 20*time.Millisecond, "the echo agent's delay between words")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long running turns may finish on SIGTERM before they are settled interrupted")
	cfg.BusyPolicies = map[string]string{}
	fs.Func("busy-policy", "agent=enqueue|reject: what a delivery to a busy session gets (repeatable; default enqueue)", func(v string) error {
		name, policy, ok := strings.Cut(v, "=")
		if !ok || (policy != "enqueue" && policy != "reject") {
			return fmt.Errorf("want agent=enqueue or agent=reject, got %q", v)
		}
		cfg.BusyPolicies[name] = policy
		return nil
	})
	fs.Func("cors-origin", "a browser origin allowed to call the API, or * for any (repeatable; default none)", func(v string) error {
		cfg.CORSOrigins = append(cfg.CORSOrigins, v)
		return nil
	})
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("serve: -log-level: %w", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))

	svc, err := Start(cfg)
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
