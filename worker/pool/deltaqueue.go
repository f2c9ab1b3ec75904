package pool

import (
	"sync"

	"github.com/convlog/convlog/transport/wire"
)

// deltaQueue publishes a turn's presentation frames from a goroutine of
// its own, and merges the text deltas that queue while it publishes: an
// agent that streams faster than frames are carried (a model token by
// token, the echo agent word by word) then costs a publish, a broker
// message and a wake-up of every reader per batch, not per token. Nothing
// is lost by merging: a merged frame's text is the concatenation of the
// deltas it replaces, in order.
type deltaQueue struct {
	publish func(wire.DeltaFrame)

	mu     sync.Mutex
	idle   *sync.Cond // broadcast when a batch has been published
	queued []wire.DeltaFrame
	busy   bool // the goroutine is publishing a batch
	closed bool

	wake chan struct{}
	done chan struct{}
	once sync.Once
}

const (
	// maxQueuedFrames bounds a queue whose broker is slower than its agent;
	// frames beyond it are dropped (they are presentation only, and the
	// records of the turn carry everything).
	maxQueuedFrames = 1024
	// maxMergedDelta bounds the text one merged frame carries.
	maxMergedDelta = 64 << 10
)

func newDeltaQueue(publish func(wire.DeltaFrame)) *deltaQueue {
	q := &deltaQueue{publish: publish, wake: make(chan struct{}, 1), done: make(chan struct{})}
	q.idle = sync.NewCond(&q.mu)
	go q.run()
	return q
}

// add queues f, merged into the last queued frame when it continues it.
func (q *deltaQueue) add(f wire.DeltaFrame) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	switch n := len(q.queued); {
	case n > 0 && merge(&q.queued[n-1], f):
	case n < maxQueuedFrames:
		q.queued = append(q.queued, f)
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// merge appends f to last if f continues it: text of the same kind, or
// argument text of the same tool call.
func merge(last *wire.DeltaFrame, f wire.DeltaFrame) bool {
	switch {
	case last.Type != f.Type || last.TurnID != f.TurnID:
		return false
	case f.Type == wire.FrameDelta && last.Kind == f.Kind && len(last.Delta)+len(f.Delta) <= maxMergedDelta:
		last.Delta += f.Delta
		return true
	case f.Type == wire.FrameToolCallDelta && last.ToolCallID == f.ToolCallID && last.ToolName == f.ToolName &&
		last.Args == nil && f.Args == nil && last.ArgsDelta != "" && len(last.ArgsDelta)+len(f.ArgsDelta) <= maxMergedDelta:
		last.ArgsDelta += f.ArgsDelta
		return true
	}
	return false
}

func (q *deltaQueue) run() {
	defer close(q.done)
	var batch []wire.DeltaFrame
	for {
		q.mu.Lock()
		for len(q.queued) == 0 && !q.closed {
			q.mu.Unlock()
			<-q.wake
			q.mu.Lock()
		}
		if len(q.queued) == 0 {
			q.mu.Unlock()
			return // closed and published
		}
		batch, q.queued = q.queued, batch[:0]
		q.busy = true
		q.mu.Unlock()
		for _, f := range batch {
			q.publish(f)
		}
		clear(batch)
		q.mu.Lock()
		q.busy = false
		q.idle.Broadcast()
		q.mu.Unlock()
	}
}

// flush returns once every frame queued so far is published: the turn
// calls it before each durable write, so that its deltas reach readers
// before the records that contain them, as they did unqueued.
func (q *deltaQueue) flush() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.queued) > 0 || q.busy {
		q.idle.Wait()
	}
}

// close publishes what is queued and stops the goroutine. Safe to call
// twice.
func (q *deltaQueue) close() {
	q.once.Do(func() {
		q.mu.Lock()
		q.closed = true
		q.mu.Unlock()
		select {
		case q.wake <- struct{}{}:
		default:
		}
		<-q.done
	})
}
