package transport

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/convlog/convlog/log/record"
)

// TestSharedFrameMatchesOwn: a frame taken from the shared cache must be
// byte for byte what the reader would have encoded itself, in both framings,
// for compact records and for the rare records with a line break.
func TestSharedFrameMatchesOwn(t *testing.T) {
	var cache frameCache
	batches := []record.Batch{
		{Offset: "0000000000000001", Records: record.RawRecords(`[{"kind":"entry","entry":{"id":"a"}}]`)},
		{Offset: "0000000000000002", Records: record.RawRecords("[{\"kind\":\"entry\",\n\"entry\":{\"id\":\"b\"}}]")},
		{Offset: "0000000000000003"},
	}
	for _, ndjson := range []bool{false, true} {
		for _, b := range batches {
			var own, shared bytes.Buffer
			w := &sseWriter{w: &own, ndjson: ndjson}
			w.conversation("inc_1", b, "0000000000000009")
			_ = w.buf.Flush()
			putBuffer(w.buf)
			f := cache.frame("inc_1", b, "0000000000000009", ndjson)
			shared.Write(f)
			if !bytes.Equal(own.Bytes(), shared.Bytes()) {
				t.Fatalf("ndjson=%v offset %s:\n shared %q\n own    %q", ndjson, b.Offset, shared.Bytes(), own.Bytes())
			}
			if again := cache.frame("inc_1", b, "0000000000000009", ndjson); &again[0] != &f[0] {
				t.Fatalf("ndjson=%v offset %s: encoded twice", ndjson, b.Offset)
			}
		}
	}
	// The cache keeps a bounded number of frames.
	for i := range 2 * frameCacheSize {
		cache.frame("inc_2", record.Batch{Offset: record.Offset(fmt.Sprintf("%016d", i))}, "x", false)
	}
	if n := len(cache.frames); n > frameCacheSize {
		t.Fatalf("%d frames cached, want at most %d", n, frameCacheSize)
	}
}

// BenchmarkLiveFrame is one reader's share of writing a live batch (a
// ~600-byte user message or reply) into its buffer: encoded by each reader,
// or taken from the shared cache.
func BenchmarkLiveFrame(b *testing.B) {
	rec := `{"kind":"entry","entry":{"id":"01JDXYZ","parentId":"01JDXYA","timestamp":"2026-12-01T20:00:00.123456789Z","type":"user_message","submissionId":"sub_01JDXYZ","payload":{"parts":[{"type":"text","text":"` + string(bytes.Repeat([]byte("x"), 400)) + `"}]}}}`
	batch := record.Batch{Offset: "0000000000000001", Records: record.RawRecords("[" + rec + "]")}
	for _, shared := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared=%v", shared), func(b *testing.B) {
			var cache frameCache
			var sink bytes.Buffer
			for b.Loop() {
				sink.Reset()
				w := &sseWriter{w: &sink}
				if shared {
					w.frames = &cache
				}
				w.conversation("inc_1", batch, "0000000000000002")
				_ = w.buf.Flush()
				putBuffer(w.buf)
			}
		})
	}
}

type nopConn struct{}

func (nopConn) Flush() error                     { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }

// TestLargeEventNotKept: a large frame (a messages view) leaves no
// buffer of its size with the reader once written, and its bytes are the
// same as a small frame's framing would make them. Each /messages reader
// once kept a scratch buffer as large as its view for the life of its
// stream.
func TestLargeEventNotKept(t *testing.T) {
	for _, size := range []int{100, 1 << 20} {
		data := bytes.Repeat([]byte("x"), size)
		var out bytes.Buffer
		w := &sseWriter{w: &out, rc: nopConn{}}
		w.event("7/inc", data)
		if err := w.flush(); err != nil {
			t.Fatal(err)
		}
		w.shrink()
		if want := "id: 7/inc\ndata: " + string(data) + "\n\n"; out.String() != want {
			t.Errorf("size %d: the frame is not what was asked", size)
		}
		if cap(w.scratch) > sseBulkBuffer {
			t.Errorf("size %d: the reader keeps %d bytes of scratch", size, cap(w.scratch))
		}
	}
}
