// Command convlog is the convlog service: durable, offset-addressed
// conversation logs, with workers that run agents and readers that tail
// conversations over SSE or JSON polling.
//
//	convlog serve [flags]   run the service (embedded NATS and bbolt by default)
//	convlog bench [flags]   measure it and print a table
//	convlog torture [flags] kill it over and over under load and verify
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		err = serveCommand(ctx, os.Args[2:])
	case "bench":
		err = benchCommand(ctx, os.Args[2:])
	case "torture":
		err = tortureCommand(ctx, os.Args[2:])
	case "-h", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "convlog: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "convlog:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: convlog <command> [flags]

commands:
  serve    run the service (HTTP API, log, embedded NATS, workers)
  bench    start the service on loopback, load it, print latency and throughput
  torture  run the service, kill -9 it repeatedly under load, verify nothing was lost

Run 'convlog <command> -h' for its flags.
`)
}
