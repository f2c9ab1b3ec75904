// Package boltceiling is the yardstick the log engine is measured against:
// the simplest timer-less group commit over bare bbolt, with no engine
// logic. The log's benchmarks and `convlog bench` both run it beside the
// engine, so that their ratio is taken under the same noise.
package boltceiling

import (
	bolt "go.etcd.io/bbolt"
)

// Bucket is the bucket Put writes to; Open makes it.
var Bucket = []byte("b")

// Open opens a bare bbolt file with the bucket made.
func Open(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{InitialMmapSize: 1 << 30})
	if err != nil {
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(Bucket); return err }); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// GroupCommitter runs one goroutine that takes every put queued during the
// previous commit's fsync into the next transaction.
type GroupCommitter struct {
	db   *bolt.DB
	reqs chan put
	done chan struct{}
}

type put struct {
	k, v []byte
	err  chan error
}

// New starts a committer on db.
func New(db *bolt.DB) *GroupCommitter {
	g := &GroupCommitter{db: db, reqs: make(chan put, 1024), done: make(chan struct{})}
	go g.loop()
	return g
}

func (g *GroupCommitter) loop() {
	defer close(g.done)
	batch := make([]put, 0, 1024)
	for r := range g.reqs {
		batch = append(batch[:0], r)
	drain:
		for len(batch) < cap(batch) {
			select {
			case r, ok := <-g.reqs:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		err := g.db.Update(func(tx *bolt.Tx) error {
			bk := tx.Bucket(Bucket)
			for _, r := range batch {
				if err := bk.Put(r.k, r.v); err != nil {
					return err
				}
			}
			return nil
		})
		for _, r := range batch {
			r.err <- err
		}
	}
}

// Put stores v at k and returns after the commit that holds it.
func (g *GroupCommitter) Put(k, v []byte) error {
	r := put{k: k, v: v, err: make(chan error, 1)}
	g.reqs <- r
	return <-r.err
}

// Close stops the committer once the queued puts are committed.
func (g *GroupCommitter) Close() { close(g.reqs); <-g.done }
