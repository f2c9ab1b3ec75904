package log

import (
	"context"
	"fmt"
	"github.com/convlog/convlog/log/record"
	"sync"
	"sync/atomic"
	"time"
)

// notifier wakes waiters on a stream. A stream nobody waits on has no slot,
// so idle streams cost nothing. A slot lives while it has subscribers and
// holds the channel the next commit closes: a commit swaps in a fresh one
// and closes the old, so one append wakes any number of waiters with one
// close, and a waiter that stays subscribed (a Watch) re-arms with one
// atomic load instead of taking the notifier's lock.
type notifier struct {
	mu    sync.Mutex
	slots map[string]*waitSlot
	delay func(waiters int) time.Duration // Options.WakeDelay; nil for none
}

type waitSlot struct {
	ch      atomic.Pointer[chan struct{}]
	refs    atomic.Int32 // changed under notifier.mu
	pending atomic.Bool  // a delayed wake-up is scheduled
}

func newWaitSlot() *waitSlot {
	s := &waitSlot{}
	ch := make(chan struct{})
	s.ch.Store(&ch)
	return s
}

// changed is the channel the next commit of the slot's stream closes.
func (s *waitSlot) changed() <-chan struct{} { return *s.ch.Load() }

// slot subscribes to k and returns its slot; unsubscribe lets it go.
func (n *notifier) slot(k string) *waitSlot {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.slots[k]
	if s == nil {
		s = newWaitSlot()
		n.slots[k] = s
	}
	s.refs.Add(1)
	return s
}

func (n *notifier) unsubscribe(k string, s *waitSlot) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s.refs.Add(-1) == 0 && n.slots[k] == s {
		delete(n.slots, k)
	}
}

func (n *notifier) subscribe(k string) (<-chan struct{}, func()) {
	s := n.slot(k)
	return s.changed(), func() { n.unsubscribe(k, s) }
}

func (n *notifier) wake(k string) {
	n.mu.Lock()
	s := n.slots[k]
	n.mu.Unlock()
	if s == nil {
		return
	}
	if n.delay != nil {
		if d := n.delay(int(s.refs.Load())); d > 0 {
			// The first commit of a window schedules the wake-up; the
			// ones before it fires are covered by it, as they are applied
			// before it swaps the channel.
			if s.pending.CompareAndSwap(false, true) {
				time.AfterFunc(d, func() {
					// Cleared before the wake-up: a commit after this
					// point schedules its own, none is lost.
					s.pending.Store(false)
					s.fire()
				})
			}
			return
		}
	}
	s.fire()
}

// fire wakes the slot's waiters. A waiter that loads the fresh channel
// after the swap reads what every commit before it made visible (the tail
// cache is applied first); one that loaded the old one is woken by its
// close.
func (s *waitSlot) fire() {
	fresh := make(chan struct{})
	close(*s.ch.Swap(&fresh))
}

// Changed returns a channel that is closed by the next commit that appends
// to the stream or resets it, for callers that select on several events at
// once (an SSE connection waits on records, deltas and its heartbeat).
// Subscribe first, then read: a commit in between still closes the channel.
// Call release when done with it, whether or not it fired.
func (db *DB) Changed(key record.Key) (ch <-chan struct{}, release func()) {
	k := string(encodeKey(key))
	db.tails.subscribe(k)
	ch, unsubscribe := db.notify.subscribe(k)
	return ch, func() {
		unsubscribe()
		db.tails.unsubscribe(k)
	}
}

// Watch follows one stream for as long as it stays open, for a reader
// that reads, waits, and reads again (an SSE stream): it subscribes once,
// where Changed subscribes on every call, and its reads skip the key's
// validation and encoding. Close it when done; Close is safe to call twice.
type Watch struct {
	db    *DB
	key   record.Key
	k     string
	slot  *waitSlot
	entry *tail
	err   error // the key's, returned by every Read
	once  sync.Once
}

// Watch starts following key. An invalid key's error comes from Read.
func (db *DB) Watch(key record.Key) *Watch {
	k := string(encodeKey(key))
	return &Watch{db: db, key: key, k: k, entry: db.tails.subscribe(k), slot: db.notify.slot(k), err: key.Validate()}
}

// Changed is closed by the next commit that appends to the stream or
// resets it (after Options.WakeDelay, if set). Take it before reading: a
// commit in between still closes it.
func (w *Watch) Changed() <-chan struct{} { return w.slot.changed() }

// Waiters is how many follow the stream now, this Watch included.
func (w *Watch) Waiters() int { return int(w.slot.refs.Load()) }

// Read is DB.ReadBytes of the watched stream.
func (w *Watch) Read(ctx context.Context, offset record.Offset, limit, maxBytes int) (record.ReadResult, error) {
	if w.err != nil {
		return record.ReadResult{}, fmt.Errorf("read %s: %w", w.key, w.err)
	}
	return w.db.readBytes(ctx, w.key, w.k, w.entry, offset, limit, maxBytes)
}

// Close stops following the stream.
func (w *Watch) Close() {
	w.once.Do(func() {
		w.db.notify.unsubscribe(w.k, w.slot)
		w.db.tails.unsubscribe(w.k)
	})
}

// Done is closed when the log closes.
func (db *DB) Done() <-chan struct{} { return db.done }

// Wait blocks until the stream differs from what the caller last saw: its
// tail is past offset or its incarnation is no longer inc (pass "" for a
// stream that did not exist). It returns nil then, ctx.Err() when the
// context ends, and ErrClosed when the log closes. It never polls and holds
// no transaction while it waits.
func (db *DB) Wait(ctx context.Context, key record.Key, offset record.Offset, inc record.Incarnation) error {
	if err := key.Validate(); err != nil {
		return err
	}
	ch, release := db.Changed(key)
	defer release()
	// Subscribed first, checked second: a commit in between still wakes us.
	cur, tail, err := db.Tail(ctx, key)
	if err != nil {
		return err
	}
	if cur != inc || tail != offset {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-db.done:
		return ErrClosed
	}
}
