package worker

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	clog "github.com/convlog/convlog/log"
)

// Presentation frame types: deltas of a running turn. They are never
// stored and never replayed; the conversation records of the same turn
// supersede them.
const (
	FrameDelta         = "delta"
	FrameToolCallDelta = "toolcall_delta"
	FrameRetrying      = "retrying"
)

// Frame is a presentation frame as readers receive it in SSE data.
type Frame struct {
	Type         string `json:"type"`
	TurnID       string `json:"turnId"`
	SubmissionID string `json:"submissionId"`

	// delta: Kind is "text" or "reasoning".
	Kind  string `json:"kind,omitempty"`
	Delta string `json:"delta,omitempty"`

	// toolcall_delta: a tool call began.
	ToolCallID string          `json:"toolCallId,omitempty"`
	ToolName   string          `json:"toolName,omitempty"`
	Args       json.RawMessage `json:"args,omitempty"`

	// retrying: the agent's advisory backoff.
	Attempt     int    `json:"attempt,omitempty"`
	MaxAttempts int    `json:"maxAttempts,omitempty"`
	DelayMs     int64  `json:"delayMs,omitempty"`
	Reason      string `json:"reason,omitempty"`
}

// DeltaBus carries presentation frames over NATS core subjects, so that a
// reader on any node sees the deltas of a turn running on any node. Each
// process holds one wildcard subscription and fans frames out to its local
// readers, so readers cost a map entry, not a subscription each.
type DeltaBus struct {
	ns  Namespace
	nc  *nats.Conn
	sub *nats.Subscription

	mu      sync.RWMutex
	readers map[string]map[uint64]func([]byte)
	nextID  uint64
}

// NewDeltaBus subscribes to every conversation's deltas in namespace ns
// ("" for the default) on nc.
func NewDeltaBus(nc *nats.Conn, ns Namespace) (*DeltaBus, error) {
	if ns != "" {
		if err := ns.Validate(); err != nil {
			return nil, err
		}
	}
	b := &DeltaBus{ns: ns, nc: nc, readers: map[string]map[uint64]func([]byte){}}
	sub, err := nc.Subscribe(ns.deltaWildcard(), b.deliver)
	if err != nil {
		return nil, fmt.Errorf("subscribe deltas: %w", err)
	}
	// Deltas are presentation-only: a slow local fan-out drops rather than
	// buffering without bound.
	if err := sub.SetPendingLimits(65536, 64<<20); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe deltas: %w", err)
	}
	b.sub = sub
	return b, nil
}

func (b *DeltaBus) deliver(m *nats.Msg) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, fn := range b.readers[m.Subject] {
		fn(m.Data)
	}
}

// Publish sends a frame to the readers of key, wherever they are.
func (b *DeltaBus) Publish(key clog.Key, f Frame) error {
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("delta frame: %w", err)
	}
	return b.nc.Publish(b.ns.deltaSubject(key), data)
}

// SubscribeDeltas calls fn with each frame for key until cancel. fn runs on
// the bus's delivery goroutine and must not block.
func (b *DeltaBus) SubscribeDeltas(key clog.Key, fn func(frame []byte)) (cancel func(), err error) {
	subj := b.ns.deltaSubject(key)
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	if b.readers[subj] == nil {
		b.readers[subj] = map[uint64]func([]byte){}
	}
	b.readers[subj][id] = fn
	b.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			delete(b.readers[subj], id)
			if len(b.readers[subj]) == 0 {
				delete(b.readers, subj)
			}
			b.mu.Unlock()
		})
	}, nil
}

// Close unsubscribes.
func (b *DeltaBus) Close() error {
	if err := b.sub.Unsubscribe(); err != nil && !strings.Contains(err.Error(), "closed") {
		return fmt.Errorf("close delta bus: %w", err)
	}
	return nil
}
