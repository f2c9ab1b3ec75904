package natsbus

import (
	"fmt"
	"testing"

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
