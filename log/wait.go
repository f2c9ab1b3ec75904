package log

import (
	"context"
	"sync"
)

// notifier wakes waiters on a stream. A stream nobody waits on has no slot,
// so idle streams cost nothing; each slot is a channel closed (and replaced
// by the next waiter) on every commit that touches the stream, so one
// append wakes any number of waiters with one close.
type notifier struct {
	mu    sync.Mutex
	slots map[string]*waitSlot
}

type waitSlot struct {
	ch   chan struct{}
	refs int
}

func (n *notifier) subscribe(k string) (<-chan struct{}, func()) {
	n.mu.Lock()
	s := n.slots[k]
	if s == nil {
		s = &waitSlot{ch: make(chan struct{})}
		n.slots[k] = s
	}
	s.refs++
	n.mu.Unlock()
	return s.ch, func() {
		n.mu.Lock()
		s.refs--
		if s.refs == 0 && n.slots[k] == s {
			delete(n.slots, k)
		}
		n.mu.Unlock()
	}
}

func (n *notifier) wake(k string) {
	n.mu.Lock()
	if s := n.slots[k]; s != nil {
		close(s.ch)
		delete(n.slots, k)
	}
	n.mu.Unlock()
}

// Changed returns a channel that is closed by the next commit that appends
// to the stream or resets it, for callers that select on several events at
// once (an SSE connection waits on records, deltas and its heartbeat).
// Subscribe first, then read: a commit in between still closes the channel.
// Call release when done with it, whether or not it fired.
func (db *DB) Changed(key Key) (ch <-chan struct{}, release func()) {
	k := string(encodeKey(key))
	db.tails.subscribe(k)
	ch, unsubscribe := db.notify.subscribe(k)
	return ch, func() {
		unsubscribe()
		db.tails.unsubscribe(k)
	}
}

// Done is closed when the log closes.
func (db *DB) Done() <-chan struct{} { return db.done }

// Wait blocks until the stream differs from what the caller last saw: its
// tail is past offset or its incarnation is no longer inc (pass "" for a
// stream that did not exist). It returns nil then, ctx.Err() when the
// context ends, and ErrClosed when the log closes. It never polls and holds
// no transaction while it waits.
func (db *DB) Wait(ctx context.Context, key Key, offset Offset, inc Incarnation) error {
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
