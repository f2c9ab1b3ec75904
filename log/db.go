package log

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Bucket names. Few large buckets, fixed-width big-endian integer keys where
// order matters: see docs/log.md for the layout.
var (
	bucketStreams     = []byte("streams")     // Key.encode() -> streamMeta
	bucketBatches     = []byte("batches")     // streamID(8) pos(8) -> batch
	bucketEntries     = []byte("entries")     // entryID streamID(8) -> pos(8)
	bucketSubmissions = []byte("submissions") // submission id -> storedSubmission (subcodec.go)
	bucketQueue       = []byte("queue")       // streamID(8) seq(8) -> submission id (unsettled only)
	bucketOutbox      = []byte("outbox")      // seq(8) -> submission id (not yet published)
	bucketIdem        = []byte("idempotency") // agent 0 instance 0 key -> idemRecord JSON
	bucketIdemExpiry  = []byte("idem-expiry") // unixnano(8) agent 0 instance 0 key -> nil
	bucketMeta        = []byte("meta")
	// The instances index and ended generations: see instances.go.
	bucketInstances = []byte("instances")         // agent 0 instance -> instanceMeta JSON
	bucketActivity  = []byte("instance-activity") // agent 0 unixnano(8) instance -> nil
	bucketArchive   = []byte("archived-streams")  // agent 0 instance 0 uid 0 session -> streamMeta
	bucketEnded     = []byte("ended-generations") // agent 0 instance 0 uid -> unixnano(8)

	allBuckets = [][]byte{bucketStreams, bucketBatches, bucketEntries, bucketSubmissions,
		bucketQueue, bucketOutbox, bucketIdem, bucketIdemExpiry, bucketMeta,
		bucketInstances, bucketActivity, bucketArchive, bucketEnded, bucketTurns}
)

// Options tune Open. The zero value is sensible.
type Options struct {
	// LockTimeout bounds the wait for another process's lock on the file.
	// Default 5s; bbolt would otherwise wait forever.
	LockTimeout time.Duration
	// InitialMmapSize avoids remaps, which wait for every read transaction,
	// while the file grows. Default 1 GiB (address space, not memory).
	InitialMmapSize int
	// MaxWritesPerCommit bounds one group commit. Default 512.
	MaxWritesPerCommit int
	// IdempotencyTTL is how long idempotency keys are honoured. Default 24h.
	IdempotencyTTL time.Duration
	// Now is the clock, for tests. Default time.Now.
	Now func() time.Time
	// Observer is told about each commit, for metrics. May be nil.
	Observer Observer
	// Check is how much of an existing file Open reads before it serves
	// (see CheckMode). Default CheckFull.
	Check CheckMode
	// Logger gets the storage's state changes: disk full and recovered,
	// an engine panic. Default slog.Default().
	Logger *slog.Logger
	// WakeDelay, when set, gathers the wake-ups of a stream that many
	// wait on: given how many wait (Changed, Wait and Watch subscribers),
	// it returns how long a commit's wake-up waits for the next commits
	// of the stream, so that they wake everyone once (0: at once). Ten
	// thousand readers of one conversation then wake once per window, not
	// once per commit. Default: every commit wakes at once.
	WakeDelay func(waiters int) time.Duration
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.LockTimeout <= 0 {
		r.LockTimeout = 5 * time.Second
	}
	if r.InitialMmapSize <= 0 {
		r.InitialMmapSize = 1 << 30
	}
	if r.MaxWritesPerCommit <= 0 {
		r.MaxWritesPerCommit = 512
	}
	if r.IdempotencyTTL <= 0 {
		r.IdempotencyTTL = 24 * time.Hour
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	return r
}

// DB is an open log. It is safe for concurrent use.
type DB struct {
	bolt     *bolt.DB
	opts     Options
	instance string // InstanceID

	writes    chan *write
	mu        sync.RWMutex // guards closed against sends on writes
	closed    bool
	done      chan struct{} // closed by Close: wakes waiters
	committed chan struct{} // closed when the committer has exited

	notify notifier
	tails  tails
	stats  commitStats
	health health
	// visible holds bbolt readers back from a commit the tail cache has
	// not caught up with (visible.go).
	visible visibility
}

// Open opens (creating if needed) the log at path. An existing file is
// checked first (Options.Check): a damaged one gives a *CorruptError
// (ErrCorrupt), one another process holds gives ErrLocked.
func Open(path string, opts *Options) (*DB, error) {
	o := opts.withDefaults()
	if info, err := os.Stat(path); err == nil && info.Size() > 0 {
		if _, err := Check(path, o.Check, o.LockTimeout); err != nil {
			return nil, err
		}
	}
	var b *bolt.DB
	err := guard(func() (err error) {
		b, err = bolt.Open(path, 0o600, &bolt.Options{
			Timeout:         o.LockTimeout,
			InitialMmapSize: o.InitialMmapSize,
			FreelistType:    bolt.FreelistMapType,
			// The freelist is rebuilt by scanning at open instead of being
			// written on every commit (as etcd does): fewer pages per commit,
			// and nothing less durable: data and meta pages are fsynced as
			// before.
			NoFreelistSync: true,
		})
		return err
	})
	if err != nil {
		return nil, openError(path, err)
	}
	if err := guard(func() error {
		return b.Update(func(tx *bolt.Tx) error {
			for _, name := range allBuckets {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			return nil
		})
	}); err != nil {
		_ = b.Close()
		if errors.Is(err, ErrCorrupt) {
			return nil, openError(path, err)
		}
		return nil, fmt.Errorf("open log %s: create buckets: %w", path, classify(err))
	}
	instance, err := ensureInstanceID(b)
	if err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	db := &DB{
		bolt:      b,
		opts:      o,
		instance:  instance,
		writes:    make(chan *write, o.MaxWritesPerCommit),
		done:      make(chan struct{}),
		committed: make(chan struct{}),
		notify:    notifier{slots: map[string]*waitSlot{}, delay: o.WakeDelay},
		tails:     tails{m: map[string]*tail{}},
	}
	db.health.logger = o.Logger
	db.health.path = path
	if err := b.View(func(tx *bolt.Tx) error { db.visible.applied.Store(uint64(tx.ID())); return nil }); err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	go db.commitLoop()
	return db, nil
}

// Path is the file the log lives in.
func (db *DB) Path() string { return db.bolt.Path() }

// Close waits for queued writes to commit, wakes every waiter with ErrClosed
// and closes the file.
func (db *DB) Close() error {
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return nil
	}
	db.closed = true
	close(db.writes)
	close(db.done)
	db.mu.Unlock()
	<-db.committed
	if err := db.bolt.Close(); err != nil {
		return fmt.Errorf("close log: %w", err)
	}
	return nil
}

// submit queues w for the next group commit and waits for its outcome. The
// context is honoured until the write is queued; after that the write's fate
// is decided by the commit, and reporting anything else would lie.
func (db *DB) submit(ctx context.Context, w *write) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.done = make(chan struct{})
	db.mu.RLock()
	if db.closed {
		db.mu.RUnlock()
		return ErrClosed
	}
	select {
	case db.writes <- w:
	case <-ctx.Done():
		db.mu.RUnlock()
		return ctx.Err()
	}
	db.mu.RUnlock()
	<-w.done
	return w.err
}

func (db *DB) isClosed() bool {
	db.mu.RLock()
	defer db.mu.RUnlock()
	return db.closed
}

// view runs fn in a read transaction. fn must not block on anything but
// bbolt: copy what it needs and return.
func (db *DB) view(fn func(tx *bolt.Tx) error) error {
	db.mu.RLock()
	closed := db.closed
	db.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	err := guard(func() error {
		for {
			var ahead uint64
			err := db.bolt.View(func(tx *bolt.Tx) error {
				if id := uint64(tx.ID()); id > db.visible.applied.Load() {
					ahead = id
					return nil
				}
				return fn(tx)
			})
			if err != nil || ahead == 0 {
				return err
			}
			// Outside the transaction: a remap by the next commit would
			// otherwise wait for us.
			db.visible.wait(ahead, db.done)
			select {
			case <-db.done:
				return ErrClosed
			default:
			}
		}
	})
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	db.health.panicked(err)
	return err
}
