package datadir

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// lock is an exclusive advisory lock on the folder's lock file, which also
// says the holder's pid and, once it serves, where it listens (Listening):
// "pid\nlisten ADDR\n". The lock, not the pid, decides: it ends with its
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
		pid, listen := parseLock(f)
		f.Close()
		return nil, &HeldError{Dir: dir, PID: pid, Listen: listen}
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &lock{f: f}, nil
}

// parseLock reads a held lock file's pid and listen address.
func parseLock(f *os.File) (pid int, listen string) {
	b := make([]byte, 512)
	n, _ := f.ReadAt(b, 0)
	first, rest, _ := bytes.Cut(b[:n], []byte("\n"))
	pid, _ = strconv.Atoi(string(bytes.TrimSpace(first)))
	if a, ok := bytes.CutPrefix(rest, []byte("listen ")); ok {
		a, _, _ = bytes.Cut(a, []byte("\n"))
		listen = string(bytes.TrimSpace(a))
	}
	return pid, listen
}

// listening adds where the holder serves to the lock file.
func (l *lock) listening(addr string) error {
	if l == nil || l.f == nil {
		return nil
	}
	_, err := l.f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\nlisten "+addr+"\n"), 0)
	return err
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

// Holder says who holds dir: nil when no process does (or dir has no lock
// file), else the holder's pid and listen address. It never takes the
// lock for longer than the look.
func Holder(dir string) (*HeldError, error) {
	f, err := os.Open(filepath.Join(dir, LockFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("data folder lock: %w", err)
	}
	defer f.Close() // a lock we took ends with it
	held, err := tryLock(f)
	if err != nil || !held {
		return nil, err
	}
	pid, listen := parseLock(f)
	return &HeldError{Dir: dir, PID: pid, Listen: listen}, nil
}
