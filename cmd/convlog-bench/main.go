// Command convlog-bench measures convlog: it starts the real service as a
// child process on loopback, loads it from this program, and prints
// latency and throughput beside bare bbolt and JetStream ceilings and
// PostgreSQL and Redis baselines behind the same HTTP shape
// (docs/benchmarks.md). It is a Go module of its own so that the product's
// module and binary never link pgx, go-redis or the plotting code.
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := benchCommand(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "convlog-bench:", err)
		os.Exit(1)
	}
}
