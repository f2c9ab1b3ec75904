package log

import (
	"encoding/binary"
	"github.com/convlog/convlog/log/record"
	"sort"
	"sync"
)

// tails caches the newest batches of the streams that someone is waiting
// on. One commit can wake thousands of readers of one conversation; each
// would otherwise open its own read transaction to fetch the same batch.
// With the cache they copy nothing and open nothing: the committer puts
// each committed batch here before it wakes them.
//
// A stream's entry lives while it has subscribers (Changed, Wait) and holds
// at most tailBatches batches and tailBytes bytes, contiguous and ending at
// the stream's tail. It is valid only from the first commit it saw: a read
// it cannot answer exactly goes to bbolt.
type tails struct {
	mu sync.RWMutex
	m  map[string]*tail
}

const (
	tailBatches = 64
	tailBytes   = 1 << 20
)

type tail struct {
	refs    int
	valid   bool
	inc     record.Incarnation
	next    uint64 // the stream's tail position
	batches []cachedBatch
	bytes   int
}

type cachedBatch struct {
	pos, count uint64
	records    record.RawRecords // shared, never modified
}

// commitNotes collects, inside a write transaction, what the tail cache
// must learn once the transaction has committed.
type commitNotes struct {
	events []noteEvent
}

type noteEvent struct {
	key   string
	inc   record.Incarnation
	reset bool
	gone  bool // the stream was removed (its instance deleted)
	batch cachedBatch
	next  uint64
}

func (n *commitNotes) batch(p *batchPlan) {
	_, k := binary.Uvarint(p.value)
	n.events = append(n.events, noteEvent{
		key:   string(encodeKey(p.key)),
		inc:   incarnationOf(p.meta.inc),
		batch: cachedBatch{pos: p.pos, count: uint64(len(p.records)), records: p.value[k:]},
		next:  p.meta.next,
	})
}

func (n *commitNotes) reset(key record.Key, m streamMeta) {
	n.events = append(n.events, noteEvent{key: string(encodeKey(key)), inc: incarnationOf(m.inc), reset: true, next: m.next})
}

func (n *commitNotes) gone(key record.Key) {
	n.events = append(n.events, noteEvent{key: string(encodeKey(key)), gone: true})
}

// subscribe keeps k's entry while the caller follows it, and returns it.
func (t *tails) subscribe(k string) *tail {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if e == nil {
		e = &tail{}
		t.m[k] = e
	}
	e.refs++
	return e
}

func (t *tails) unsubscribe(k string) {
	t.mu.Lock()
	if e := t.m[k]; e != nil {
		if e.refs--; e.refs == 0 {
			delete(t.m, k)
		}
	}
	t.mu.Unlock()
}

// apply records a committed transaction's batches and resets.
func (t *tails) apply(n *commitNotes) {
	if len(n.events) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ev := range n.events {
		e := t.m[ev.key]
		if e == nil {
			continue
		}
		switch {
		case ev.gone:
			// Reads go to bbolt, which knows the stream is gone.
			e.valid, e.inc, e.next, e.batches, e.bytes = false, "", 0, nil, 0
		case ev.reset:
			e.valid, e.inc, e.next, e.batches, e.bytes = true, ev.inc, ev.next, nil, 0
		case e.valid && e.inc == ev.inc && e.next == ev.batch.pos:
			e.batches = append(e.batches, ev.batch)
			e.bytes += len(ev.batch.records)
			e.next = ev.next
		default:
			// The first commit this entry sees: the cache starts here.
			e.valid, e.inc, e.next = true, ev.inc, ev.next
			e.batches, e.bytes = append(e.batches[:0], ev.batch), len(ev.batch.records)
		}
		for len(e.batches) > tailBatches || (len(e.batches) > 1 && e.bytes > tailBytes) {
			e.bytes -= len(e.batches[0].records)
			e.batches = e.batches[1:]
		}
	}
}

// invalidate sends the reads of the streams n touched to bbolt until
// their next commit.
func (t *tails) invalidate(n *commitNotes) {
	if len(n.events) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ev := range n.events {
		if e := t.m[ev.key]; e != nil {
			e.valid, e.inc, e.next, e.batches, e.bytes = false, "", 0, nil, 0
		}
	}
}

// read answers a Read from the cache, if it can exactly.
// A subscriber that holds the entry passes it as e, sparing the lookup.
func (t *tails) read(k string, e *tail, pos uint64, limit, maxBytes int) (record.ReadResult, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if e == nil {
		e = t.m[k]
	}
	if e == nil || !e.valid {
		return record.ReadResult{}, false
	}
	res := record.ReadResult{Incarnation: e.inc, Batches: []record.Batch{}, NextOffset: record.OffsetOf(pos), UpToDate: true}
	if pos == e.next {
		return res, true
	}
	i := sort.Search(len(e.batches), func(i int) bool { return e.batches[i].pos >= pos })
	if i == len(e.batches) || e.batches[i].pos != pos {
		return record.ReadResult{}, false // older than the cache, or not a batch boundary
	}
	records, size := 0, 0
	next := pos
	for _, b := range e.batches[i:] {
		if len(res.Batches) > 0 && (records+int(b.count) > limit || size+len(b.records) > maxBytes) {
			break
		}
		res.Batches = append(res.Batches, record.Batch{Offset: record.OffsetOf(b.pos), Count: int(b.count), Records: b.records})
		records += int(b.count)
		size += len(b.records)
		next = b.pos + b.count
	}
	res.NextOffset = record.OffsetOf(next)
	res.UpToDate = next == e.next
	res.Remaining = e.next - next
	return res, true
}

// tailOf answers Tail from the cache.
func (t *tails) tailOf(k string) (record.Incarnation, uint64, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if e := t.m[k]; e != nil && e.valid {
		return e.inc, e.next, true
	}
	return "", 0, false
}
