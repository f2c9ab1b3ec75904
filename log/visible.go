package log

import (
	"sync"
	"sync/atomic"
)

// visibility makes the log's two read paths agree. A commit becomes
// visible to bbolt readers when its meta page is written, inside
// bolt.Tx.Commit; it reaches the tail cache (tails) only after Commit
// returns, when the committer applies its notes. A reader that saw a
// commit through bbolt (a submission's status, say) and then read the
// stream from the cache could find the stream older than the status:
// "completed" with no reply yet. So a read transaction that sees a
// transaction the cache has not applied waits, outside bbolt, until it
// is applied. The window is the committer's few instructions between
// Commit and apply, longer only when the committer is descheduled.
//
// Every bbolt write of an open DB goes through the committer, so the
// applied id only grows and every id a reader can see is eventually
// applied.
type visibility struct {
	applied atomic.Uint64 // the newest write transaction the cache reflects

	mu sync.Mutex
	ch chan struct{} // closed when applied moves; nil until a reader waits
}

// set records that transaction id and those before it are applied.
func (v *visibility) set(id uint64) {
	if id <= v.applied.Load() {
		return
	}
	v.applied.Store(id)
	v.mu.Lock()
	ch := v.ch
	v.ch = nil
	v.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// wait returns once transaction id is applied, or when done closes.
func (v *visibility) wait(id uint64, done <-chan struct{}) {
	for v.applied.Load() < id {
		v.mu.Lock()
		if v.ch == nil {
			v.ch = make(chan struct{})
		}
		ch := v.ch
		v.mu.Unlock()
		if v.applied.Load() >= id { // set ran before we took ch
			return
		}
		select {
		case <-ch:
		case <-done:
			return
		}
	}
}
