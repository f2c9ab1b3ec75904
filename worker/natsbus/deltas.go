package natsbus

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// deltaWindow is how many recent frames a conversation keeps for readers
// that are busy writing: one further behind skips the oldest.
const deltaWindow = 256

// DeltaBus carries presentation frames over NATS core subjects, so that a
// reader on any node sees the deltas of a turn running on any node. Each
// process holds one wildcard subscription. A frame for a conversation that
// local readers follow goes into that conversation's window of recent
// frames, and one channel close wakes every reader waiting on it: a frame
// costs O(1) whatever the number of readers, and a reader busy writing
// takes everything that accumulated in one write when it comes back.
type DeltaBus struct {
	ns  Namespace
	nc  *nats.Conn
	sub *nats.Subscription

	mu      sync.Mutex
	streams map[string]*deltaStream // subject -> followed conversation
	delay   func(readers int) time.Duration
}

// SetWakeDelay makes a frame's wake-up of a conversation's readers wait
// delay(readers) (0: at once), so that a busy conversation's readers wake
// once for what a window brings, as the log's Options.WakeDelay does for
// its commits. A reader that comes back from writing with frames waiting
// takes them at once; only a wait is delayed. Set it before use.
func (b *DeltaBus) SetWakeDelay(delay func(readers int) time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.delay = delay
}

type deltaStream struct {
	mu     sync.Mutex
	frames [deltaWindow][]byte // ring: frame n is at n % deltaWindow
	next   uint64              // number of frames received
	ready  chan struct{}       // closed by the next frame
	refs   int                 // cursors; guarded by DeltaBus.mu
}

// NewDeltaBus subscribes to every conversation's deltas in namespace ns
// ("" for the default) on nc.
func NewDeltaBus(nc *nats.Conn, ns Namespace) (*DeltaBus, error) {
	if ns != "" {
		if err := ns.Validate(); err != nil {
			return nil, err
		}
	}
	b := &DeltaBus{ns: ns, nc: nc, streams: map[string]*deltaStream{}}
	sub, err := nc.Subscribe(ns.deltaWildcard(), b.deliver)
	if err != nil {
		return nil, fmt.Errorf("subscribe deltas: %w", err)
	}
	// Deltas are presentation-only: if this process cannot keep up, NATS
	// drops rather than buffering without bound.
	if err := sub.SetPendingLimits(65536, 64<<20); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe deltas: %w", err)
	}
	b.sub = sub
	return b, nil
}

func (b *DeltaBus) deliver(m *nats.Msg) {
	b.mu.Lock()
	s := b.streams[m.Subject]
	var delay time.Duration
	if s != nil && b.delay != nil {
		delay = b.delay(s.refs)
	}
	b.mu.Unlock()
	if s == nil {
		return // nobody here follows it
	}
	s.mu.Lock()
	s.frames[s.next%deltaWindow] = m.Data
	s.next++
	woken := s.ready
	s.ready = make(chan struct{})
	s.mu.Unlock()
	if delay <= 0 {
		close(woken)
		return
	}
	// The readers waiting now wake at the window's end and take what
	// came meanwhile; a reader that asks for Ready after this frame gets
	// a closed channel at once (it has frames to take), and the others a
	// fresh one, so none wakes for frames it has already taken.
	time.AfterFunc(delay, func() { close(woken) })
}

// Publish sends a frame to the readers of key, wherever they are.
func (b *DeltaBus) Publish(key record.Key, f wire.DeltaFrame) error {
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("delta frame: %w", err)
	}
	return b.nc.Publish(b.ns.deltaSubject(key), data)
}

// FollowDeltas returns a cursor over key's frames from now on. It
// satisfies transport's DeltaSource.
func (b *DeltaBus) FollowDeltas(key record.Key) (*DeltaCursor, error) {
	subj := b.ns.deltaSubject(key)
	b.mu.Lock()
	s := b.streams[subj]
	if s == nil {
		s = &deltaStream{ready: make(chan struct{})}
		b.streams[subj] = s
	}
	s.refs++
	b.mu.Unlock()
	s.mu.Lock()
	seen := s.next
	s.mu.Unlock()
	return &DeltaCursor{bus: b, subj: subj, s: s, seen: seen}, nil
}

// DeltaCursor is one reader's position in a conversation's frames.
type DeltaCursor struct {
	bus    *DeltaBus
	subj   string
	s      *deltaStream
	seen   uint64
	closed bool
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Ready is closed when frames past the cursor exist.
func (c *DeltaCursor) Ready() <-chan struct{} {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.next > c.seen {
		return closedChan
	}
	return c.s.ready
}

// Next appends the frames past the cursor to dst; frames older than the
// window are skipped.
func (c *DeltaCursor) Next(dst [][]byte) [][]byte {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	from := c.seen
	if c.s.next-from > deltaWindow {
		from = c.s.next - deltaWindow
	}
	for n := from; n < c.s.next; n++ {
		dst = append(dst, c.s.frames[n%deltaWindow])
	}
	c.seen = c.s.next
	return dst
}

// Close releases the cursor; the conversation's window goes with its last
// cursor.
func (c *DeltaCursor) Close() {
	if c.closed {
		return
	}
	c.closed = true
	b := c.bus
	b.mu.Lock()
	if c.s.refs--; c.s.refs == 0 && b.streams[c.subj] == c.s {
		delete(b.streams, c.subj)
	}
	b.mu.Unlock()
}

// NewDeltaPublisher is a bus that only publishes: a remote worker's, whose
// process has no readers to deliver to.
func NewDeltaPublisher(nc *nats.Conn, ns Namespace) (*DeltaBus, error) {
	if ns != "" {
		if err := ns.Validate(); err != nil {
			return nil, err
		}
	}
	return &DeltaBus{ns: ns, nc: nc, streams: map[string]*deltaStream{}}, nil
}

// Close unsubscribes.
func (b *DeltaBus) Close() error {
	if b.sub == nil {
		return nil
	}
	if err := b.sub.Unsubscribe(); err != nil && !strings.Contains(err.Error(), "closed") {
		return fmt.Errorf("close delta bus: %w", err)
	}
	return nil
}
