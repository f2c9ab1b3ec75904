package pool

import (
	"context"
	"errors"
	"log/slog"
	"time"

	clog "github.com/convlog/convlog/log"
)

// noSpaceWait bounds how long a turn's settlement waits for a full disk
// to have room again. The turn holds its answer in memory meanwhile; past
// the bound (or when the turn is cancelled) it gives up and the session's
// next recovery settles it interrupted, as after a crash.
const noSpaceWait = 30 * time.Second

// retryNoSpace runs write until it succeeds or fails for another reason
// than a full disk (clog.ErrNoSpace), for at most noSpaceWait.
func retryNoSpace(ctx context.Context, logger *slog.Logger, what string, write func() error) error {
	err := write()
	if !errors.Is(err, clog.ErrNoSpace) {
		return err
	}
	logger.Warn("worker: disk full; retrying until there is space", "write", what, "for up to", noSpaceWait)
	deadline := time.Now().Add(noSpaceWait)
	for backoff := 100 * time.Millisecond; errors.Is(err, clog.ErrNoSpace) && time.Now().Before(deadline); backoff = min(2*backoff, 2*time.Second) {
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		err = write()
	}
	return err
}
