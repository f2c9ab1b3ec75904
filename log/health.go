package log

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// spaceRecovered is the free space at which a log whose writes failed for
// want of space is reported writable again without waiting for a write to
// prove it: bbolt grows its file in steps of 16 MiB.
const spaceRecovered = 32 << 20

// classify maps the operating system's "disk full" and "quota exceeded"
// to ErrNoSpace, so callers can branch on it (HTTP answers 507).
func classify(err error) error {
	if err == nil || errors.Is(err, ErrNoSpace) {
		return err
	}
	// bbolt formats its file-resize error with %s, which drops the errno:
	// match its text too.
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		strings.Contains(err.Error(), "no space left on device") ||
		strings.Contains(err.Error(), "disk quota exceeded") {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

// health is the log's storage condition as the last commits found it.
type health struct {
	logger *slog.Logger
	path   string

	mu        sync.Mutex
	noSpace   error     // the last commit's ErrNoSpace, until space is back
	since     time.Time // when noSpace began
	lastFail  time.Time // the latest ErrNoSpace
	lastProbe time.Time
	damaged   error // the first engine panic: sticky
}

func (h *health) failed(err error) {
	if !errors.Is(err, ErrNoSpace) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.noSpace == nil {
		h.since = time.Now()
		h.logger.Error("log: disk full, writes are refused (HTTP 507) until there is space again",
			"file", h.path, "err", err)
	}
	h.noSpace, h.lastFail = err, time.Now()
}

// succeeded clears a full disk only when no write has failed for a second:
// on a nearly full disk small commits fit the file's free pages while
// larger ones fail, and the state (and the log) should not flap with them.
func (h *health) succeeded() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.noSpace != nil && time.Since(h.lastFail) >= time.Second {
		h.recoveredLocked("writes succeed")
	}
}

func (h *health) recoveredLocked(why string) {
	if h.noSpace == nil {
		return
	}
	h.noSpace = nil
	h.logger.Info("log: writes succeed again after a full disk", "file", h.path, "why", why,
		"refused for", time.Since(h.since).Round(time.Millisecond))
}

// panicked records an engine panic caught by guard, once, with its stack.
func (h *health) panicked(err error) {
	var ep *enginePanic
	if !errors.As(err, &ep) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.damaged != nil {
		return
	}
	h.damaged = &CorruptError{Path: h.path, Reason: fmt.Sprint(ep.value)}
	h.logger.Error("log: the storage engine panicked reading the file; the file is probably damaged: "+
		"stop the service and restore it from a backup", "file", h.path, "panic", fmt.Sprint(ep.value),
		"stack", string(ep.stack))
}

// Health reports whether the log can take writes: nil, an ErrNoSpace
// while writes fail for want of space, or a CorruptError (ErrCorrupt) once
// the engine panicked on the file. While writes fail for want of space it
// also looks at the free space (at most once a second), so that a log
// nobody writes to (a load balancer took it out) comes back by itself.
func (db *DB) Health() error {
	h := &db.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.damaged != nil {
		return h.damaged
	}
	if h.noSpace == nil {
		return nil
	}
	if time.Since(h.lastProbe) >= time.Second {
		h.lastProbe = time.Now()
		if free, err := FreeSpace(filepath.Dir(h.path)); err == nil && free >= spaceRecovered {
			h.recoveredLocked(fmt.Sprintf("%d MiB free", free>>20))
			return nil
		}
	}
	return h.noSpace
}

// FreeSpace is the number of bytes an unprivileged process may still write
// on the file system that holds path (a file or a folder that exists): for
// the checks that refuse to start, or say not ready, before a full disk
// makes writes fail.
func FreeSpace(path string) (uint64, error) { return freeSpace(path) }
