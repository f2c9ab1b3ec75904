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
		if err := goleak.Find(); err != nil {
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
