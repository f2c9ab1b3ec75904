package worker

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

func TestDeadOwner(t *testing.T) {
	host, _ := os.Hostname()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	me := strconv.Itoa(os.Getpid())
	l := &leases{host: host, owner: []byte(host + " " + me + " 01ARZ3NDEKTSV4RRFFQ69G5FAV")}
	liveOwners.Store(host+" "+me+" 01ARZ3NDEKTSV4RRFFQ69G5FAV", true)
	liveOwners.Store(host+" "+me+" 01CX5ZZKBKACTAV9WEVGEMMVRZ", true) // another pool of this process
	cases := []struct {
		owner string
		dead  bool
	}{
		{host + " " + strconv.Itoa(gone.Process.Pid) + " X", true},    // exited process of this host
		{host + " " + me + " 01BX5ZZKBKACTAV9WEVGEMMVRZ", true},       // an earlier life of this pid
		{host + " " + me + " 01ARZ3NDEKTSV4RRFFQ69G5FAV", false},      // us, now
		{host + " " + strconv.Itoa(os.Getppid()) + " X", false},       // a live process
		{"elsewhere " + strconv.Itoa(gone.Process.Pid) + " X", false}, // another host: only its TTL tells
		{"garbage", false},
	}
	for _, tc := range cases {
		if got := l.deadOwner([]byte(tc.owner)); got != tc.dead {
			t.Errorf("deadOwner(%q) = %v, want %v", tc.owner, got, tc.dead)
		}
	}
}
