// Package datadir owns convlog's data folder: who holds it, and whether
// what is in it is a whole deployment (a log and, with the embedded broker,
// its JetStream store), a new folder to initialise, or something an
// operator should look at before the service starts on it.
package datadir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	clog "github.com/convlog/convlog/log"
)

// Names inside the data folder.
const (
	LogFile      = "convlog.db"
	JetStreamDir = "jetstream"
	LockFile     = "convlog.lock"
	// RestoredFile marks a log just put in place by `convlog restore`.
	RestoredFile = "convlog.restored"
)

var (
	// ErrHeld: another process holds the data folder.
	ErrHeld = errors.New("data folder held by another process")
	// ErrIncomplete: the folder holds part of a deployment (an empty log
	// file, or a log without its broker store or the reverse).
	ErrIncomplete = errors.New("data folder incomplete")
)

// HeldError names the folder and, when its lock file says, the holder.
type HeldError struct {
	Dir string
	PID int // 0 when unknown
	// Listen is the holder's HTTP address, as Folder.Listening recorded
	// it ("" when unknown: it has not served yet, or is older).
	Listen string
}

func (e *HeldError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = fmt.Sprintf("another process (pid %d)", e.PID)
	}
	return fmt.Sprintf("data folder %s is in use by %s; stop it first, or give this one another --data", e.Dir, who)
}

func (e *HeldError) Unwrap() error { return ErrHeld }

// IncompleteError says what is missing and what to do.
type IncompleteError struct {
	Dir, Problem, Remedy string
}

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("data folder %s: %s; %s", e.Dir, e.Problem, e.Remedy)
}

func (e *IncompleteError) Unwrap() error { return ErrIncomplete }

// Folder is a data folder this process holds.
type Folder struct {
	Dir string
	// New: the folder had no log; Open created an empty one.
	New bool
	// JetStream: the embedded broker's store was there (not empty).
	JetStream bool

	embedded bool
	init     bool
	lock     *lock
}

// LogPath is the log file's path.
func (f *Folder) LogPath() string { return filepath.Join(f.Dir, LogFile) }

// JetStreamPath is the embedded broker's store.
func (f *Folder) JetStreamPath() string { return filepath.Join(f.Dir, JetStreamDir) }

// Open takes the data folder dir (creating it if absent) for this process
// and checks what it holds. embedded says the broker's store lives here too.
// A new folder, or one with neither a log nor a store, gets an empty log.
// An empty (0-byte) log file, or a store without its log, is refused
// unless init: that is a lost or half-restored deployment, not a new one,
// and starting on it would silently present an empty log.
func Open(dir string, embedded, init bool) (_ *Folder, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data folder: %w", err)
	}
	f := &Folder{Dir: dir, embedded: embedded, init: init}
	if f.lock, err = acquire(dir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.lock.release()
		}
	}()
	if embedded {
		ents, err := os.ReadDir(f.JetStreamPath())
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("data folder: %w", err)
		}
		f.JetStream = len(ents) > 0
	}
	info, err := os.Stat(f.LogPath())
	switch {
	case err == nil && info.Size() > 0:
		return f, nil
	case err == nil && !init:
		return nil, &IncompleteError{Dir: dir,
			Problem: fmt.Sprintf("the log file %s is empty (0 bytes), as a failed copy or restore leaves it", LogFile),
			Remedy:  "restore it from a backup, or start with an empty log with `convlog serve --init`"}
	case err == nil: // empty and init: start over
		if err := os.Remove(f.LogPath()); err != nil {
			return nil, fmt.Errorf("data folder: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("data folder: %w", err)
	case f.JetStream && !init:
		return nil, &IncompleteError{Dir: dir,
			Problem: fmt.Sprintf("it has a JetStream store (%s/) but no log file (%s)", JetStreamDir, LogFile),
			Remedy:  "restore the log from a backup, or start with an empty log with `convlog serve --init`"}
	}
	if err := f.create(); err != nil {
		return nil, err
	}
	f.New = true
	return f, nil
}

// create makes an empty log under a temporary name and renames it into
// place, so that a crash while bbolt writes its first pages cannot leave
// the 0-byte log file that the next start refuses.
func (f *Folder) create() error {
	tmp := f.LogPath() + ".new"
	_ = os.Remove(tmp)
	db, err := clog.Open(tmp, nil)
	if err != nil {
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, f.LogPath()); err != nil {
		return fmt.Errorf("data folder: %w", err)
	}
	return syncDir(f.Dir)
}

// CheckLog is the check that needs the open log: with the embedded broker,
// a log that holds data but whose store is gone is refused unless init
// (the folder was copied without it, or the service ran on an external
// broker before). A log never written is a first start cut short.
func (f *Folder) CheckLog(db *clog.DB) error {
	mark := filepath.Join(f.Dir, RestoredFile)
	if _, err := os.Stat(mark); err == nil {
		// A backup holds only the log: its store starts empty, once.
		return os.Remove(mark)
	}
	if !f.embedded || f.JetStream || f.New || f.init {
		return nil
	}
	empty, err := db.Empty()
	if err != nil || empty {
		return err
	}
	return &IncompleteError{Dir: f.Dir,
		Problem: fmt.Sprintf("it has a log (%s) but no JetStream store (%s/)", LogFile, JetStreamDir),
		Remedy: "restore the whole folder from a backup; or, if the store was removed on purpose or the service " +
			"used an external broker before (the store holds only doorbells and leases, which the log can do without), " +
			"start with `convlog serve --init`"}
}

// MarkRestored records that dir's log was just restored from a backup,
// which holds only the log: the next start accepts the log without a
// JetStream store beside it (and removes the mark).
func MarkRestored(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, RestoredFile), []byte("restored by convlog restore\n"), 0o644); err != nil {
		return fmt.Errorf("data folder: %w", err)
	}
	return syncDir(dir)
}

// Close lets the folder go.
func (f *Folder) Close() error { return f.lock.release() }

// Listening records in the folder's lock file the HTTP address the holder
// serves on, so that a command given only the folder (convlog backup
// --data) finds the service that holds it.
func (f *Folder) Listening(addr string) error { return f.lock.listening(addr) }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("data folder: sync: %w", err)
	}
	return nil
}
