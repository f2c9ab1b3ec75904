package natsbus

import "testing"

func TestPredecessor(t *testing.T) {
	const folder = "ins_01ARZ3NDEKTSV4RRFFQ69G5FAV"
	l := &Leases{folder: folder + " ", owner: []byte(leaseOwner(folder))}
	cases := []struct {
		owner string
		dead  bool
	}{
		{folder + " 01BX5ZZKBKACTAV9WEVGEMMVRZ", true},                       // an earlier process of this folder
		{leaseOwner(folder), false},                                          // this process (any of its pools)
		{"ins_01CX5ZZKBKACTAV9WEVGEMMVRZ 01BX5ZZKBKACTAV9WEVGEMMVRZ", false}, // another folder
		{"somehost 1 01BX5ZZKBKACTAV9WEVGEMMVRZ", false},                     // the old host+pid form
		{folder, false}, {folder + " ", false}, {folder + " a b", false}, {"", false}, // not a form we make
	}
	for _, tc := range cases {
		if got := l.predecessor([]byte(tc.owner)); got != tc.dead {
			t.Errorf("predecessor(%q) = %v, want %v", tc.owner, got, tc.dead)
		}
	}
	// A pool whose log has no instance id takes nothing over.
	empty := &Leases{folder: " "}
	if empty.predecessor([]byte(" 01BX5ZZKBKACTAV9WEVGEMMVRZ")) {
		t.Error("empty folder id took a lease over")
	}
}
