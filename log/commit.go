package log

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// write is one caller's unit of work in a group commit.
//
// prepare runs inside the shared write transaction. It must check
// everything before it changes anything: a refusal is returned as an error
// and leaves the transaction untouched, so the other writers of the same
// commit are unaffected. Once checks pass it returns the mutation, which may
// fail only for storage reasons; such a failure aborts the whole commit, and
// the committer then retries every write in a transaction of its own.
type write struct {
	prepare func(tx *bolt.Tx, now time.Time, notes *commitNotes) (mutate func() error, touched []byte, err error)

	err  error
	done chan struct{}
}

// update runs fn in bbolt's write transaction with engine panics caught
// (see guard): a damaged page fails this commit, not the process.
func (db *DB) update(fn func(tx *bolt.Tx) error) error {
	return guard(func() error { return db.bolt.Update(fn) })
}

// storageError marks a failure of bbolt itself inside a mutation.
type storageError struct{ err error }

func (e storageError) Error() string { return e.err.Error() }
func (e storageError) Unwrap() error { return e.err }

// testHookCommitted, when set by a test, runs after each successful bbolt
// commit and before the tail cache learns of it: it widens that window.
var testHookCommitted func()

type commitStats struct {
	commits atomic.Uint64
	writes  atomic.Uint64
}

// CommitStats reports how many transactions the group committer ran and how
// many writes they carried: writes/commits is the mean group size.
func (db *DB) CommitStats() (commits, writes uint64) {
	return db.stats.commits.Load(), db.stats.writes.Load()
}

// commitLoop is the single writer. It has no timer: it takes whatever queued
// while the previous commit was fsyncing, so a lone writer pays one fsync and
// many writers share one.
func (db *DB) commitLoop() {
	defer close(db.committed)
	batch := make([]*write, 0, db.opts.MaxWritesPerCommit)
	for w := range db.writes {
		batch = append(batch[:0], w)
		// Writers released by the previous commit are runnable but may not
		// have queued yet; one yield lets them join this commit instead of
		// making the next one small. Alone, a writer loses nothing by it.
		runtime.Gosched()
	drain:
		for len(batch) < cap(batch) {
			select {
			case w, ok := <-db.writes:
				if !ok {
					break drain
				}
				batch = append(batch, w)
			default:
				break drain
			}
		}
		db.commit(batch)
	}
}

func (db *DB) commit(batch []*write) {
	touched := make([][]byte, len(batch))
	notes := &commitNotes{}
	began := time.Now()
	var synced time.Duration
	var txid uint64
	err := db.update(func(tx *bolt.Tx) error {
		txid = uint64(tx.ID())
		if db.opts.Observer != nil {
			// Commit adds the time spent writing and fsyncing pages to
			// the transaction's stats before it calls its handlers.
			tx.OnCommit(func() { st := tx.Stats(); synced = st.GetWriteTime() })
		}
		now := db.opts.Now().UTC()
		*notes = commitNotes{}
		for i, w := range batch {
			w.err, touched[i] = nil, nil
			mutate, t, err := w.prepare(tx, now, notes)
			if err != nil {
				w.err = err
				continue
			}
			if mutate != nil {
				if err := mutate(); err != nil {
					return storageError{err}
				}
			}
			touched[i] = t
		}
		return nil
	})
	if err != nil {
		// A commit can fail after its meta page was written (the last
		// fsync), visible to readers though never applied: the cache
		// forgets what it touched, and readers are not held for it.
		db.tails.invalidate(notes)
		db.visible.set(txid)
		if len(batch) > 1 {
			// One write broke the shared transaction; isolate it.
			for _, w := range batch {
				db.commit([]*write{w})
			}
			return
		}
		var se storageError
		if errors.As(err, &se) {
			err = se.err
		}
		db.health.panicked(err)
		err = classify(err)
		db.health.failed(err)
		batch[0].err = fmt.Errorf("commit: %w", err)
		touched[0] = nil
	} else {
		db.health.succeeded()
	}
	db.stats.commits.Add(1)
	db.stats.writes.Add(uint64(len(batch)))
	if err == nil && db.opts.Observer != nil {
		db.opts.Observer.Committed(len(batch), time.Since(began), synced)
	}
	if err == nil {
		if testHookCommitted != nil {
			testHookCommitted()
		}
		// Before the wake-ups: woken readers find the new batches cached.
		db.tails.apply(notes)
		db.visible.set(txid)
		// A write that removes streams wakes their readers itself: one
		// touched key per write cannot name them all.
		for _, ev := range notes.events {
			if ev.gone {
				db.notify.wake(ev.key)
			}
		}
	}
	for i, w := range batch {
		if touched[i] != nil {
			db.notify.wake(string(touched[i]))
		}
		close(w.done)
	}
}
