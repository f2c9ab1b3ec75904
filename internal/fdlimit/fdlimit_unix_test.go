//go:build unix

package fdlimit

import (
	"syscall"
	"testing"
)

// Raise lifts a lowered soft limit back to the hard limit.
func TestRaise(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	if orig.Max < 512 {
		t.Skipf("hard limit %d too low to lower", orig.Max)
	}
	low := orig
	low.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	got, err := Raise()
	if err != nil {
		t.Fatal(err)
	}
	var now syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now); err != nil {
		t.Fatal(err)
	}
	if now.Cur != orig.Max || got != uint64(now.Cur) {
		t.Fatalf("after Raise: soft %d (reported %d), hard %d", now.Cur, got, orig.Max)
	}
}

func TestDefaultMaxStreams(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		want  int
	}{{1024, 768}, {20000, 17500}, {1 << 20, 1<<20 - 8192}, {100, 16}} {
		if got := DefaultMaxStreams(c.limit); got != c.want {
			t.Errorf("DefaultMaxStreams(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
}
