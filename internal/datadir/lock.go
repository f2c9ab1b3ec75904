package datadir

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// lock is an exclusive advisory lock on the folder's lock file, which also
// says the holder's pid. The lock, not the pid, decides: it ends with its
// process however that dies, so a pid left by a kill -9 means nothing and
// is overwritten by the next holder.
type lock struct{ f *os.File }

func acquire(dir string) (*lock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data folder lock: %w", err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data folder lock %s: %w", path, err)
	}
	if held {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		pid, _ := strconv.Atoi(string(bytes.TrimSpace(b[:n])))
		f.Close()
		return nil, &HeldError{Dir: dir, PID: pid}
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &lock{f: f}, nil
}

func (l *lock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	// The pid goes with the lock, so a reader never sees a stale one
	// while the folder is free. Unlocking is closing.
	_ = l.f.Truncate(0)
	err := l.f.Close()
	l.f = nil
	return err
}
