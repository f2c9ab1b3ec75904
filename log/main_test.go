package log_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	closeCatchUp()
	if code == 0 {
		// bbolt's consistency check rebuilds the freelist of a file like
		// ours (no freelist page) by a walk whose goroutine blocks for
		// ever on its second error once the first has panicked: a leak of
		// bbolt's on a damaged file (TestOpenRandomBytes), not ours.
		if err := goleak.Find(goleak.IgnoreAnyFunction("go.etcd.io/bbolt.(*DB).freepages.func2")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// tmpDir makes a folder that outlives one benchmark, for fixtures that
// several share; closeCatchUp removes it.
func tmpDir() (string, error) { return os.MkdirTemp("", "convlog-bench-") }

func closeCatchUp() {
	if catchUp.db != nil {
		catchUp.db.Close()
	}
	if catchUp.dir != "" {
		os.RemoveAll(catchUp.dir)
	}
}
