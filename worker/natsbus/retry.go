package natsbus

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// RetryStart calls start until it succeeds, ctx ends, or it fails with
// ErrNamespaceInUse, which waiting does not mend (that error is returned).
// A start that needs the broker retries rather than failing its process:
// the broker may be down or electing a leader, and admission does not wait
// for it. Each failure goes to failed (for readiness) and to the log as
// "<what>; retrying", with a backoff from 100 ms to 5 s. RetryStart
// returns nil when ctx ends first.
func RetryStart(ctx context.Context, logger *slog.Logger, what string, start func() error, failed func(error)) error {
	backoff := 100 * time.Millisecond
	for {
		err := start()
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrNamespaceInUse) {
			return err
		}
		failed(err)
		logger.Warn(what+"; retrying", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}
