package natsbus

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// A cursor that falls more than the window behind skips the oldest frames
// and keeps the newest, in order; a cursor taken later sees only later
// frames.
func TestDeltaCursorWindow(t *testing.T) {
	b := &DeltaBus{streams: map[string]*deltaStream{}}
	const subj = "convlog.live.a.i.s"
	b.mu.Lock()
	b.streams[subj] = &deltaStream{ready: make(chan struct{})}
	b.mu.Unlock()
	b.streams[subj].refs = 1
	early := &DeltaCursor{bus: b, subj: subj, s: b.streams[subj]}
	select {
	case <-early.Ready():
		t.Fatal("ready before any frame")
	default:
	}
	for i := range deltaWindow + 10 {
		b.deliver(&nats.Msg{Subject: subj, Data: []byte(fmt.Sprint(i))})
	}
	select {
	case <-early.Ready():
	default:
		t.Fatal("not ready after frames")
	}
	got := early.Next(nil)
	if len(got) != deltaWindow || string(got[0]) != "10" || string(got[len(got)-1]) != fmt.Sprint(deltaWindow+9) {
		t.Fatalf("%d frames, first %s last %s", len(got), got[0], got[len(got)-1])
	}
	if len(early.Next(nil)) != 0 {
		t.Fatal("frames twice")
	}
	b.deliver(&nats.Msg{Subject: subj, Data: []byte("last")})
	if got := early.Next(nil); len(got) != 1 || string(got[0]) != "last" {
		t.Fatalf("after catching up: %q", got)
	}
	b.deliver(&nats.Msg{Subject: "convlog.live.other", Data: []byte("x")}) // nobody follows: dropped
}

// With a wake delay, the readers waiting when a frame arrives wake at the
// window's end; a reader that asks for Ready with frames waiting gets a
// closed channel at once, and one that has taken them a fresh one that the
// delayed wake-up does not close.
func TestDeltaWakeDelay(t *testing.T) {
	const window = 300 * time.Millisecond
	b := &DeltaBus{streams: map[string]*deltaStream{}}
	b.SetWakeDelay(func(readers int) time.Duration {
		if readers < 2 {
			return 0
		}
		return window
	})
	const subj = "convlog.live.a.i.s"
	s := &deltaStream{ready: make(chan struct{}), refs: 2}
	b.streams[subj] = s
	waiting := &DeltaCursor{bus: b, subj: subj, s: s}
	busy := &DeltaCursor{bus: b, subj: subj, s: s}

	ready := waiting.Ready()
	began := time.Now()
	b.deliver(&nats.Msg{Subject: subj, Data: []byte("1")})
	select {
	case <-ready:
		if time.Since(began) < window {
			t.Fatalf("woken %s after the frame, within the window", time.Since(began))
		}
	default:
	}
	// The busy reader comes back with a frame waiting: no wait.
	select {
	case <-busy.Ready():
	default:
		t.Fatal("a cursor with a frame waiting was not ready at once")
	}
	if got := busy.Next(nil); len(got) != 1 {
		t.Fatalf("busy took %q", got)
	}
	after := busy.Ready()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting reader was not woken 10 s after the window")
	}
	if got := waiting.Next(nil); len(got) != 1 || string(got[0]) != "1" {
		t.Fatalf("waiting took %q", got)
	}
	select {
	case <-after:
		t.Fatal("the delayed wake-up closed the channel of a reader that had taken the frame")
	default:
	}
	// One reader: at once.
	s.refs = 1
	b.deliver(&nats.Msg{Subject: subj, Data: []byte("2")})
	select {
	case <-after:
	default:
		t.Fatal("a single reader was not woken at once")
	}
}
