package log

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Observer is told about the engine's work, for metrics. The engine calls it
// on its single committer goroutine: it must not block.
type Observer interface {
	// Committed reports one group commit that carried writes writes: total
	// is the whole bbolt transaction, sync the part spent writing its
	// pages and meta page and fsyncing them.
	Committed(writes int, total, sync time.Duration)
}

// Backlog counts what waits in the log for the workers.
type Backlog struct {
	// Outbox is the admitted (or resumed: every approval decided)
	// submissions not yet published to the broker.
	Outbox int
	// Unsettled is the submissions admitted, running or input_required.
	Unsettled int
}

// Backlog counts the outbox and the unsettled submissions. It walks the
// pages of both buckets, which hold only work in progress: cheap while the
// service keeps up, and what an operator wants to see when it does not.
func (db *DB) Backlog(ctx context.Context) (Backlog, error) {
	if err := ctx.Err(); err != nil {
		return Backlog{}, err
	}
	var b Backlog
	err := db.view(func(tx *bolt.Tx) error {
		b.Outbox = tx.Bucket(bucketOutbox).Stats().KeyN
		b.Unsettled = tx.Bucket(bucketQueue).Stats().KeyN
		return nil
	})
	return b, err
}

// Backup writes a consistent copy of the whole log file, as of one read
// transaction, while writers go on. begin is called first with the copy's
// exact size (for a Content-Length) and returns where to write it.
//
// The read transaction is held for the copy's duration: the file may grow
// meanwhile (pages freed by later commits are not reused until it ends), and
// a remap beyond Options.InitialMmapSize would wait for it.
func (db *DB) Backup(ctx context.Context, begin func(size int64) (io.Writer, error)) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var n int64
	err := db.view(func(tx *bolt.Tx) error {
		w, err := begin(tx.Size())
		if err != nil {
			return err
		}
		n, err = tx.WriteTo(ctxWriter{ctx, w})
		return err
	})
	if err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	return n, nil
}

// ctxWriter stops a long copy when its context ends.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// ErrLocked means another process has the log open.
var ErrLocked = errors.New("log file in use by another process")

// BackupFile copies the log at path, which no process may have open, into
// w: the offline form of Backup. A file held by a running service is
// ErrLocked: back it up through the service instead.
func BackupFile(path string, begin func(size int64) (io.Writer, error)) (int64, error) {
	if _, err := os.Stat(path); err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	b, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 200 * time.Millisecond})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return 0, fmt.Errorf("backup %s: %w", path, ErrLocked)
	}
	if err != nil {
		return 0, fmt.Errorf("backup %s: %w", path, err)
	}
	defer b.Close()
	var n int64
	err = b.View(func(tx *bolt.Tx) error {
		w, err := begin(tx.Size())
		if err != nil {
			return err
		}
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("backup %s: %w", path, err)
	}
	return n, nil
}

// RestoreOptions tune Restore.
type RestoreOptions struct {
	// KeepIncarnations keeps every stream's incarnation as in the backup.
	// By default each stream gets a new one, so that a reader holding an
	// offset from before the restore, possibly past the backup's end or
	// into records the backup never saw, re-reads from the start instead
	// of taking the restored records for the ones it knew.
	KeepIncarnations bool
	// Replace allows replacing an existing file at the destination (which
	// no process may have open).
	Replace bool
}

// RestoreResult says what Restore did.
type RestoreResult struct {
	Bytes   int64
	Streams int // streams in the backup
	Renewed int // streams given a new incarnation
}

// Restore writes the backup read from src to the log file dst, offline: no
// process may have dst open. The copy is written beside dst, checked, given
// new incarnations (unless opts says otherwise), synced, and renamed over
// dst, so that a failed restore leaves dst as it was.
func Restore(ctx context.Context, src io.Reader, dst string, opts RestoreOptions) (RestoreResult, error) {
	var res RestoreResult
	if _, err := os.Stat(dst); err == nil {
		if !opts.Replace {
			return res, fmt.Errorf("restore: %s exists; restoring over it must be asked for (RestoreOptions.Replace, convlog restore --replace)", dst)
		}
		// Refuse while a service holds it: renaming over an open bbolt
		// file would leave that service writing to the unlinked one.
		b, err := bolt.Open(dst, 0o600, &bolt.Options{Timeout: 200 * time.Millisecond})
		if errors.Is(err, bolterrors.ErrTimeout) {
			return res, fmt.Errorf("restore %s: %w", dst, ErrLocked)
		}
		if err == nil {
			b.Close()
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return res, fmt.Errorf("restore: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	tmp := dst + ".restoring"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	defer os.Remove(tmp) // after the rename, a no-op
	res.Bytes, err = io.Copy(f, ctxReader{ctx, src})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, fmt.Errorf("restore: writing %s: %w", tmp, err)
	}
	b, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return res, fmt.Errorf("restore: the backup is not a log file: %w", err)
	}
	err = b.Update(func(tx *bolt.Tx) error {
		streams := tx.Bucket(bucketStreams)
		if streams == nil {
			return errors.New("the backup is not a convlog log: no streams bucket")
		}
		type renewal struct{ k, v []byte }
		var renew []renewal
		err := streams.ForEach(func(k, v []byte) error {
			res.Streams++
			if opts.KeepIncarnations {
				return nil
			}
			m, err := decodeStreamMeta(v)
			if err != nil {
				return err
			}
			m.inc = ulid.Make()
			renew = append(renew, renewal{append([]byte(nil), k...), m.encode()})
			return nil
		})
		if err != nil {
			return err
		}
		// Not inside ForEach: a bucket must not change under its cursor.
		for _, r := range renew {
			if err := streams.Put(r.k, r.v); err != nil {
				return err
			}
		}
		res.Renewed = len(renew)
		return nil
	})
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	if d, err := os.Open(filepath.Dir(dst)); err == nil {
		_ = d.Sync() // the rename itself durable
		d.Close()
	}
	return res, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
