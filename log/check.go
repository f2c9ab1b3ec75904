package log

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// CorruptError says what is wrong with a damaged log file. It wraps
// ErrCorrupt.
type CorruptError struct {
	Path   string
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("log file %s is damaged: %s; restore it from a backup (or move it away and start with an empty log)", e.Path, e.Reason)
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// bbolt's on-disk meta page, as its file format version 2 lays it out
// (internal/common/meta.go): a 16-byte page header, then magic, version,
// page size, flags, root bucket (pgid, sequence), freelist pgid, high-water
// pgid, txid and an FNV-64a checksum of everything before it. bbolt checks
// these at open too, but it trusts the high-water mark: a file shorter than
// it is mapped anyway and the first read past its end is a SIGBUS, which no
// recover catches. So this reads them first.
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	pageHeaderSize = 16
	metaSize       = 64
)

type metaPage struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

func parseMeta(b []byte) (metaPage, error) {
	if len(b) < pageHeaderSize+metaSize {
		return metaPage{}, errors.New("short")
	}
	m := b[pageHeaderSize : pageHeaderSize+metaSize]
	le := binary.LittleEndian
	if le.Uint32(m[0:]) != boltMagic {
		return metaPage{}, errors.New("not a bbolt meta page (bad magic)")
	}
	if v := le.Uint32(m[4:]); v != boltVersion {
		return metaPage{}, fmt.Errorf("bbolt file format version %d, want %d", v, boltVersion)
	}
	h := fnv.New64a()
	h.Write(m[:56])
	if h.Sum64() != le.Uint64(m[56:]) {
		return metaPage{}, errors.New("meta page checksum mismatch")
	}
	return metaPage{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]),
		pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}, nil
}

// checkFileShape reads the two meta pages and checks the file holds every
// page they claim. It returns the newest valid meta. It touches nothing
// through mmap, so it cannot fault.
func checkFileShape(path string) (metaPage, error) {
	f, err := os.Open(path)
	if err != nil {
		return metaPage{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return metaPage{}, err
	}
	size := info.Size()
	corrupt := func(format string, args ...any) error {
		return &CorruptError{Path: path, Reason: fmt.Sprintf(format, args...)}
	}
	if size < 2*pageHeaderSize+metaSize {
		return metaPage{}, corrupt("the file is %d bytes, too short to be a bbolt database", size)
	}
	buf := make([]byte, pageHeaderSize+metaSize)
	read := func(off int64) (metaPage, error) {
		if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
			return metaPage{}, err
		}
		return parseMeta(buf)
	}
	m0, err0 := read(0)
	pageSize := int64(os.Getpagesize())
	if err0 == nil {
		pageSize = int64(m0.pageSize)
	}
	m1, err1 := read(pageSize)
	var m metaPage
	switch {
	case err0 != nil && err1 != nil:
		return metaPage{}, corrupt("both meta pages are invalid (page 0: %v; page 1: %v)", err0, err1)
	case err0 != nil:
		m = m1
	case err1 != nil:
		m = m0
	case m1.txid > m0.txid:
		m = m1
	default:
		m = m0
	}
	if m.pageSize < 512 || m.pageSize&(m.pageSize-1) != 0 {
		return metaPage{}, corrupt("meta page gives page size %d", m.pageSize)
	}
	if need := int64(m.pgid) * int64(m.pageSize); size < need {
		return metaPage{}, corrupt("the file is %d bytes but its last commit needs %d (%d pages of %d): truncated",
			size, need, m.pgid, m.pageSize)
	}
	if m.root < 2 || m.root >= m.pgid {
		return metaPage{}, corrupt("root page %d outside the file's %d pages", m.root, m.pgid)
	}
	return m, nil
}

// guard runs fn with memory faults turned into panics, and any panic into a
// returned error. bbolt reads pages through its mmap and asserts on what it
// finds there, so a damaged file shows up as a panic (a bad page) or a
// fault (a page past the end of a shrunken file), both of which would end
// the process. A read or write transaction rolls back on a panic (View and
// Update defer it), so the DB stays usable for the parts that are intact.
func guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = &enginePanic{value: r, stack: debug.Stack()}
		}
	}()
	return fn()
}

// enginePanic is a panic caught in bbolt: the file is damaged where it was
// read, or the engine has a bug. Either way, not the caller's mistake.
type enginePanic struct {
	value any
	stack []byte
}

func (e *enginePanic) Error() string { return fmt.Sprintf("storage engine panic: %v", e.value) }
func (e *enginePanic) Unwrap() error { return ErrCorrupt }

// CheckMode is how much of the file Open reads before it serves.
type CheckMode int

const (
	// CheckDefault is CheckFull.
	CheckDefault CheckMode = iota
	// CheckWalk checks the meta pages and the file size,
	// then reads every key and value of every bucket, touching the first
	// and last byte of each, with faults caught. bbolt itself walks every
	// page at open (it rebuilds the freelist by scanning, NoFreelistSync),
	// in a goroutine where a damaged page is a crash; the walk first makes
	// sure it will not be.
	CheckWalk
	// CheckFull adds bbolt's consistency check (tx.Check): every page
	// reachable once, none both used and free, keys in order. It is the
	// default because bbolt's open runs the same check on every page and
	// panics (in a goroutine of its own, which no caller can recover, and
	// which then leaks) at the first problem; run first, it reports them.
	CheckFull
	// CheckShape checks only the meta pages and the file size.
	CheckShape
)

// CheckReport is what a check found and what it cost.
type CheckReport struct {
	Pages    int64 // the high-water mark: pages in use or free
	PageSize int
	Keys     int
	Bytes    int64
	Duration time.Duration
}

// Check checks the log file at path without opening it for writing: the
// meta pages, the file size and, per mode, a read of every record or
// bbolt's consistency check. A damaged file gives a *CorruptError (wrapping
// ErrCorrupt); a file another process holds gives ErrLocked.
func Check(path string, mode CheckMode, lockTimeout time.Duration) (CheckReport, error) {
	start := time.Now()
	var rep CheckReport
	m, err := checkFileShape(path)
	if err != nil {
		return rep, err
	}
	rep.Pages, rep.PageSize = int64(m.pgid), int(m.pageSize)
	if mode == CheckDefault {
		mode = CheckFull
	}
	if mode == CheckShape {
		rep.Duration = time.Since(start)
		return rep, nil
	}
	if lockTimeout <= 0 {
		lockTimeout = 5 * time.Second
	}
	var b *bolt.DB
	err = guard(func() (err error) {
		b, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
		return err
	})
	if err != nil {
		return rep, openError(path, err)
	}
	defer b.Close()
	err = guard(func() error {
		return b.View(func(tx *bolt.Tx) error {
			return tx.ForEach(func(name []byte, bk *bolt.Bucket) error {
				c := bk.Cursor()
				var sink byte
				var prev []byte
				for k, v := c.First(); k != nil; k, v = c.Next() {
					if prev != nil && bytes.Compare(prev, k) >= 0 {
						return &CorruptError{Path: path, Reason: fmt.Sprintf("bucket %q: keys out of order", name)}
					}
					prev = k
					rep.Keys++
					rep.Bytes += int64(len(k) + len(v))
					sink ^= k[0] ^ k[len(k)-1]
					if len(v) > 0 {
						sink ^= v[0] ^ v[len(v)-1]
					}
				}
				_ = sink
				return nil
			})
		})
	})
	if err != nil {
		return rep, openError(path, err)
	}
	if mode == CheckFull {
		err = guard(func() error {
			return b.View(func(tx *bolt.Tx) error {
				var errs []error
				for e := range tx.Check() {
					if len(errs) < 5 {
						errs = append(errs, e)
					}
				}
				return errors.Join(errs...)
			})
		})
		if err != nil {
			return rep, &CorruptError{Path: path, Reason: "consistency check: " + err.Error()}
		}
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// openError names what went wrong opening or reading the file.
func openError(path string, err error) error {
	var ce *CorruptError
	var ep *enginePanic
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("log file %s: %w", path, ErrLocked)
	case errors.As(err, &ep):
		return &CorruptError{Path: path, Reason: fmt.Sprint(ep.value)}
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return &CorruptError{Path: path, Reason: err.Error()}
	}
	return fmt.Errorf("open log %s: %w", path, err)
}
