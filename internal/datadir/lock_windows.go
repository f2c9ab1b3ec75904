//go:build windows

package datadir

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

// tryLock locks a byte range past the pid (Windows locks are mandatory
// on the range, and the pid must stay readable) without waiting.
func tryLock(f *os.File) (held bool, err error) {
	ol := new(windows.Overlapped)
	ol.Offset = 1 << 20
	err = windows.LockFileEx(windows.Handle(f.Fd()),
		windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return true, nil
	}
	return false, err
}
