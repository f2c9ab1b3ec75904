// Package replproto is the prototype of the replicated write path that
// docs/scale-out.md weighs: each log commit is also published, batched, to
// an R3 JetStream stream per partition, conditional on the last sequence
// the owner applied (Nats-Expected-Last-Sequence), so that NATS itself
// refuses a stale owner; bbolt would become the owner's rebuildable index.
// It is measured (BenchmarkReplicatedAppend), not used by the product.
package replproto

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrStaleOwner: the partition's stream has moved past the sequence this
// owner applied last; another owner wrote to it.
var ErrStaleOwner = errors.New("stale partition owner")

// Owner appends to one partition's stream. Appends from any goroutine are
// gathered while the previous batch is in flight and published as one
// message (a group commit), conditional on the last sequence.
type Owner struct {
	js      jetstream.JetStream
	subject string

	mu      sync.Mutex
	lastSeq uint64
	queue   []pending
	busy    bool
}

type pending struct {
	rec  []byte
	done chan error
}

// Partition creates (or opens) the partition's stream with replicas and
// returns an owner that starts from its last sequence.
func Partition(ctx context.Context, nc *nats.Conn, name string, replicas int) (*Owner, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{"replproto." + name}, Replicas: replicas,
		Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("partition %s: %w", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	return &Owner{js: js, subject: "replproto." + name, lastSeq: info.State.LastSeq}, nil
}

// Append stores rec durably in the partition (acked by a majority of its
// replicas) and returns once it is.
func (o *Owner) Append(ctx context.Context, rec []byte) error {
	p := pending{rec: rec, done: make(chan error, 1)}
	o.mu.Lock()
	o.queue = append(o.queue, p)
	lead := !o.busy
	o.busy = true
	o.mu.Unlock()
	if lead {
		o.flush(ctx)
	}
	return <-p.done
}

// maxBatch bounds the records of one message.
const maxBatch = 512

// flush publishes batches until the queue is empty; one goroutine at a
// time flushes, the others wait for their batch's ack.
func (o *Owner) flush(ctx context.Context) {
	for {
		o.mu.Lock()
		n := min(len(o.queue), maxBatch)
		if n == 0 {
			o.busy = false
			o.mu.Unlock()
			return
		}
		batch := o.queue[:n:n]
		o.queue = o.queue[n:]
		seq := o.lastSeq
		o.mu.Unlock()
		size := 0
		for _, p := range batch {
			size += 4 + len(p.rec)
		}
		data := make([]byte, 0, size)
		for _, p := range batch {
			data = append(data, byte(len(p.rec)>>24), byte(len(p.rec)>>16), byte(len(p.rec)>>8), byte(len(p.rec)))
			data = append(data, p.rec...)
		}
		ack, err := o.js.Publish(ctx, o.subject, data, jetstream.WithExpectLastSequence(seq))
		if err == nil {
			o.mu.Lock()
			o.lastSeq = ack.Sequence
			o.mu.Unlock()
		} else if isWrongLastSeq(err) {
			err = fmt.Errorf("%w: expected last sequence %d: %v", ErrStaleOwner, seq, err)
		}
		for _, p := range batch {
			p.done <- err
		}
	}
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
