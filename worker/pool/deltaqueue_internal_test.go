package pool

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/convlog/convlog/transport/wire"
)

// Frames queued while the publisher is busy are merged where one continues
// the last, kept apart otherwise, in order; flush waits for all of them.
func TestDeltaQueueMergesWhileBusy(t *testing.T) {
	var mu sync.Mutex
	var got []string
	first := make(chan struct{})
	release := make(chan struct{})
	q := newDeltaQueue(func(f wire.DeltaFrame) {
		mu.Lock()
		n := len(got)
		got = append(got, fmt.Sprintf("%s/%s/%s%s", f.Type, f.Kind, f.Delta, f.ArgsDelta))
		mu.Unlock()
		if n == 0 {
			close(first)
			<-release // busy: what comes meanwhile queues
		}
	})
	defer q.close()
	text := func(kind, s string) wire.DeltaFrame {
		return wire.DeltaFrame{Type: wire.FrameDelta, Kind: kind, Delta: s, TurnID: "turn_1"}
	}
	args := func(s string) wire.DeltaFrame {
		return wire.DeltaFrame{Type: wire.FrameToolCallDelta, ToolCallID: "c1", ToolName: "f", ArgsDelta: s, TurnID: "turn_1"}
	}
	q.add(text("text", "a"))
	<-first
	for _, f := range []wire.DeltaFrame{
		text("text", "b"), text("text", "c"), // merged
		text("reasoning", "r1"), text("reasoning", "r2"), // merged, apart from the text
		args(`{"x"`), args(`:1}`), // merged
		{Type: wire.FrameRetrying, Attempt: 1, TurnID: "turn_1"},
		text("text", "d"), text("text", "e"),
	} {
		q.add(f)
	}
	done := make(chan struct{})
	go func() { q.flush(); close(done) }()
	select {
	case <-done:
		t.Fatal("flush returned while a frame was still being published")
	default:
	}
	close(release)
	<-done
	mu.Lock()
	defer mu.Unlock()
	want := []string{"delta/text/a", "delta/text/bc", "delta/reasoning/r1r2", `toolcall_delta//{"x":1}`, "retrying//", "delta/text/de"}
	if strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Fatalf("published\n%v\nwant\n%v", got, want)
	}
}

// A broker slower than the agent costs a bounded queue: merged text stops
// at maxMergedDelta, frames beyond maxQueuedFrames are dropped, and close
// publishes what is queued, once.
func TestDeltaQueueBounded(t *testing.T) {
	var mu sync.Mutex
	frames, bytes := 0, 0
	first := make(chan struct{})
	release := make(chan struct{})
	q := newDeltaQueue(func(f wire.DeltaFrame) {
		mu.Lock()
		frames++
		bytes += len(f.Delta)
		n := frames
		mu.Unlock()
		if n == 1 {
			close(first)
			<-release
		}
	})
	q.add(wire.DeltaFrame{Type: wire.FrameDelta, Kind: "text", Delta: "x"})
	<-first
	chunk := strings.Repeat("y", maxMergedDelta/2)
	for range 3 * maxQueuedFrames {
		q.add(wire.DeltaFrame{Type: wire.FrameDelta, Kind: "text", Delta: chunk})
	}
	close(release)
	q.close()
	q.close()
	q.add(wire.DeltaFrame{Type: wire.FrameDelta, Kind: "text", Delta: "after close"})
	mu.Lock()
	defer mu.Unlock()
	if frames != 1+maxQueuedFrames || bytes != 1+maxQueuedFrames*2*len(chunk) {
		t.Fatalf("%d frames, %d bytes published; want %d, %d", frames, bytes, 1+maxQueuedFrames, 1+maxQueuedFrames*2*len(chunk))
	}
}
