package transport

import (
	"bytes"
	"sync"

	"github.com/convlog/convlog/log/record"
)

// frameCache shares the encoded conversation frame of a live batch among
// the readers of its conversation: with thousands of readers at the tail,
// each commit is encoded once instead of once per reader. A frame is
// named by its incarnation, offset and next offset, which fix its bytes
// for good (an incarnation id is a fresh ULID of one stream, and a stream
// only grows within it), so an entry never goes stale; the cache only has
// to stay small, and keeps the most recent frames.
type frameCache struct {
	mu     sync.RWMutex
	frames map[frameKey][]byte
	ring   [frameCacheSize]frameKey
	next   int
}

// frameCacheSize covers the batches that are live at once (each open
// conversation with a commit in flight needs one or two); frameCacheMax
// bounds what one holds, so the cache stays under 4 MiB. A larger frame is
// encoded by each reader, as a catch-up page is.
const (
	frameCacheSize = 256
	frameCacheMax  = 16 << 10
)

type frameKey struct {
	inc          record.Incarnation
	offset, next record.Offset
	ndjson       bool
}

// frame returns the frame of batch b as w would write it, shared and never
// to be modified.
func (c *frameCache) frame(inc record.Incarnation, b record.Batch, next record.Offset, ndjson bool) []byte {
	k := frameKey{inc: inc, offset: b.Offset, next: next, ndjson: ndjson}
	c.mu.RLock()
	f, ok := c.frames[k]
	c.mu.RUnlock()
	if ok {
		return f
	}
	var buf bytes.Buffer
	enc := &sseWriter{w: &buf, ndjson: ndjson}
	enc.conversation(inc, b, next)
	if enc.buf != nil {
		_ = enc.buf.Flush()
		putBuffer(enc.buf)
	}
	f = buf.Bytes()
	if len(f) > frameCacheMax {
		return f
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if have, ok := c.frames[k]; ok {
		return have
	}
	if c.frames == nil {
		c.frames = make(map[frameKey][]byte, frameCacheSize)
	}
	if old := c.ring[c.next]; old != (frameKey{}) {
		delete(c.frames, old)
	}
	c.ring[c.next], c.next = k, (c.next+1)%frameCacheSize
	c.frames[k] = f
	return f
}
