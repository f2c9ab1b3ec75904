package transport

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// ndjsonKeepalive is the keepalive line of an NDJSON stream.
const ndjsonKeepalive = `{"type":"keepalive"}` + "\n"

// sseWriter writes Server-Sent Events to a response. Frames collect in a
// large buffer borrowed from a pool for the duration of one flush, so that a
// page of records leaves in a few big writes, while an idle connection holds
// no buffer of its own. The first write error sticks: every later call is a
// no-op returning it, so a handler checks once per page instead of once per
// line.
type sseWriter struct {
	w       io.Writer
	rc      streamConn
	buf     *bufio.Writer // borrowed between the first write and the flush
	scratch []byte
	err     error
	timeout time.Duration // per flush; 0 for none
	armed   time.Time     // the write deadline set last
	// ndjson writes the same frames as newline-delimited JSON: one object
	// per line, no ids, a {"type":"keepalive"} object for a keepalive
	// comment and nothing for other comments.
	ndjson bool
	// frames, when set, shares live frames with the other readers.
	frames *frameCache
	// counters, when set, counts the flushes that wrote.
	counters *streamCounters
}

// streamCounters counts what the streams hand their sockets: a flush
// that wrote anything is one write (the buffer is larger than a live
// flush), so writes per frame tells how well coalescing works.
type streamCounters struct {
	writes, bytes atomic.Uint64
}

// Buffer sizes trade syscalls for memory held only while writing: a live
// tail writes a few frames at a time, a catch-up writes pages of
// thousands. Thousands of live readers flushing at once would otherwise
// each hold (and leave resident) a catch-up-sized buffer.
const (
	sseTailBuffer = 8 << 10
	sseBulkBuffer = 64 << 10
)

var (
	sseTailBuffers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, sseTailBuffer) }}
	sseBulkBuffers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, sseBulkBuffer) }}
)

// bulk borrows a catch-up-sized buffer for what is written until the next
// flush, if none is borrowed yet.
func (w *sseWriter) bulk() {
	if w.buf == nil && w.err == nil {
		w.deadline()
		w.buf = sseBulkBuffers.Get().(*bufio.Writer)
		w.buf.Reset(w.w)
	}
}

func (w *sseWriter) write(b []byte) {
	if w.err != nil {
		return
	}
	if w.buf == nil {
		w.deadline()
		w.buf = sseTailBuffers.Get().(*bufio.Writer)
		w.buf.Reset(w.w)
	}
	_, w.err = w.buf.Write(b)
}

// putBuffer returns a borrowed buffer to the pool of its size.
func putBuffer(b *bufio.Writer) {
	b.Reset(nil)
	if b.Size() == sseBulkBuffer {
		sseBulkBuffers.Put(b)
	} else {
		sseTailBuffers.Put(b)
	}
}

// comment writes ": text", which clients ignore: a keepalive that also
// proves the peer is still there (a write to a closed socket fails).
func (w *sseWriter) comment(text string) {
	if w.ndjson {
		if text == "keepalive" {
			w.write([]byte(ndjsonKeepalive))
		}
		return
	}
	w.scratch = append(append(append(w.scratch[:0], ": "...), text...), "\n\n"...)
	w.write(w.scratch)
}

// event writes one event: an id line when id is not empty, and data as
// one "data:" line per line of it, so that no byte of data can end the
// event early or forge a field.
func (w *sseWriter) event(id string, data []byte) {
	b := w.scratch[:0]
	if w.ndjson {
		// A line break inside a JSON value can only be white space
		// between tokens (strings escape theirs): a space keeps the
		// value and the one-object-per-line framing.
		start := len(b)
		b = append(b, data...)
		for i := start; i < len(b); i++ {
			if b[i] == '\n' || b[i] == '\r' {
				b[i] = ' '
			}
		}
		b = append(b, '\n')
		w.write(b)
		w.scratch = b[:0]
		return
	}
	if id != "" {
		b = append(append(append(b, "id: "...), id...), '\n')
	}
	// A large frame without line breaks (a messages view) goes out as it
	// is, not copied into the scratch buffer, which would then keep its
	// size for the life of the stream.
	if len(data) > sseTailBuffer && !bytes.ContainsAny(data, "\r\n") {
		w.write(append(b, "data: "...))
		w.write(data)
		w.write([]byte("\n\n"))
		w.scratch = b[:0]
		return
	}
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			break
		}
		b = append(append(append(b, "data: "...), data[:i]...), '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	b = append(append(append(b, "data: "...), data...), "\n\n"...)
	w.write(b)
	w.scratch = b[:0]
}

// conversation writes the frame of one batch:
//
//	id: <next>
//	data: {"type":"conversation","incarnation":"inc_…","offset":"<next>","nextOffset":"<next>","batchOffset":"<batch offset>","records":[…]}
//
// Every field of the frame named like a resume point is one: "offset" and
// "nextOffset" are both where to resume (the event id), so a client that
// takes "the last offset of a conversation frame", as the streaming protocol
// words it, gets no batch twice. Where the batch itself starts is
// "batchOffset".
//
// The stored records are spliced in without decoding. They are compact
// JSON, written by encoding/json; should they ever hold a line break, the
// frame takes the slower path that splits it into data lines.
func (w *sseWriter) conversation(inc record.Incarnation, b record.Batch, next record.Offset) {
	if w.frames != nil && (w.buf == nil || w.buf.Size() != sseBulkBuffer) {
		// A live frame (a catch-up page borrows the bulk buffer first):
		// the other readers at the tail write the same bytes.
		w.write(w.frames.frame(inc, b, next, w.ndjson))
		return
	}
	h := w.scratch[:0]
	h = append(h, `{"type":"conversation","incarnation":`...)
	h = appendIncarnation(h, inc)
	h = append(h, `,"offset":`...)
	h = appendString(h, string(next))
	h = append(h, `,"nextOffset":`...)
	h = appendString(h, string(next))
	h = append(h, `,"batchOffset":`...)
	h = appendString(h, string(b.Offset))
	h = append(h, `,"records":`...)
	w.scratch = h[:0]
	// Stored records are compact JSON without line breaks (the log's
	// encoder escapes them); two memchr scans keep that an invariant
	// checked here rather than trusted.
	if bytes.IndexByte(b.Records, '\n') >= 0 || bytes.IndexByte(b.Records, '\r') >= 0 {
		// A fresh buffer: event builds its lines in scratch.
		data := append(appendRecords(bytes.Clone(h), b.Records), '}')
		w.event(string(next), data)
		return
	}
	if !w.ndjson {
		w.write([]byte("id: " + string(next) + "\ndata: "))
	}
	w.write(h)
	if len(b.Records) == 0 {
		w.write([]byte("[]"))
	} else {
		w.write(b.Records)
	}
	if w.ndjson {
		w.write([]byte("}\n"))
	} else {
		w.write([]byte("}\n\n"))
	}
}

// streamError is the data of an error frame, the last frame of a stream.
type streamError struct {
	Type string `json:"type"`
	*wire.APIError
}

// MarshalJSON puts "type" first, then the error's own fields.
func (e streamError) MarshalJSON() ([]byte, error) {
	inner, err := e.APIError.MarshalJSON()
	if err != nil {
		return nil, err
	}
	return append([]byte(`{"type":"error",`), inner[1:]...), nil
}

// errorFrame writes {"type":"error","code":...,"message":...} with no id:
// an error is not a position to resume from.
func (w *sseWriter) errorFrame(e *wire.APIError) {
	data, err := json.Marshal(streamError{Type: wire.FrameError, APIError: e})
	if err != nil {
		data = []byte(`{"type":"error","code":"internal","message":"internal error"}`)
	}
	w.event("", data)
}

// release returns a borrowed buffer unflushed: for a stream that ends on
// an error, whose pending bytes have nowhere to go.
func (w *sseWriter) release() {
	if w.buf != nil {
		putBuffer(w.buf)
		w.buf = nil
	}
}

// shrink lets go of a scratch buffer grown by a large frame.
func (w *sseWriter) shrink() {
	if cap(w.scratch) > sseBulkBuffer {
		w.scratch = nil
	}
}

// flush sends what was written to the client and returns the buffer. What
// is written between two flushes has one deadline: a peer that takes
// nothing for that long is dead or stalled.
func (w *sseWriter) flush() error {
	if w.buf != nil {
		if n := w.buf.Buffered(); w.err == nil && n > 0 {
			// Counted before the write, so that a client that has the
			// bytes finds them counted.
			if w.counters != nil {
				w.counters.writes.Add(1)
				w.counters.bytes.Add(uint64(n))
			}
			w.err = w.buf.Flush()
		}
		putBuffer(w.buf)
		w.buf = nil
	}
	if w.err == nil {
		w.err = w.rc.Flush()
	}
	return w.err
}

// deadline arms the write deadline for what is about to be written: at
// least timeout from now. It sets it half a timeout further, so that the
// writes of the next half timeout find it armed far enough and skip the
// call (a stream at the tail writes many times a second, and each call
// takes the runtime's timer locks).
func (w *sseWriter) deadline() {
	if w.timeout <= 0 || w.err != nil {
		return
	}
	now := time.Now()
	if w.armed.Sub(now) >= w.timeout {
		return
	}
	w.armed = now.Add(w.timeout + w.timeout/2)
	_ = w.rc.SetWriteDeadline(w.armed)
}

// Frame types of the lifecycle (see lifecycle.go).
const (
	// FrameReset says the stream got a new incarnation: what the reader
	// holds is void, and the stream goes on from offset "0" of the new
	// one. Its id is "0", so that a reconnect after it resumes there.
	FrameReset = "reset"
	// FrameEnded is the last frame of a stream whose instance was
	// deleted; the response ends after it.
	FrameEnded = "ended"
)

// resetFrame writes
//
//	id: 0
//	data: {"type":"reset","incarnation":"inc_new","previousIncarnation":"inc_old","offset":"0"}
func (w *sseWriter) resetFrame(old, inc record.Incarnation) {
	b := append([]byte(nil), `{"type":"reset","incarnation":`...)
	b = appendIncarnation(b, inc)
	b = append(b, `,"previousIncarnation":`...)
	b = appendIncarnation(b, old)
	b = append(b, `,"offset":"0"}`...)
	w.event(string(record.Start), b)
}

// endedFrame writes, with no id (there is nothing to resume),
//
//	data: {"type":"ended","reason":"deleted","incarnation":"inc_…","message":…}
func (w *sseWriter) endedFrame(inc record.Incarnation) {
	b := append([]byte(nil), `{"type":"ended","reason":"deleted","incarnation":`...)
	b = appendIncarnation(b, inc)
	b = append(b, `,"message":"the conversation ended: its instance was deleted"}`...)
	w.event("", b)
}
