// Command convlog-torture kills the real convlog service with SIGKILL over
// and over under load (and, on request, its NATS broker), then verifies
// from the log that nothing admitted was lost, repeated or left unsettled.
// See docs/torture.md.
//
//	convlog-torture -bin bin/convlog [flags]
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
	if err := tortureCommand(ctx, os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "convlog-torture:", err)
		os.Exit(1)
	}
}
