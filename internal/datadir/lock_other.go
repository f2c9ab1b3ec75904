//go:build !unix && !windows

package datadir

import "os"

// tryLock: no folder lock here; bbolt's own lock on the log still keeps a
// second process out, after its timeout.
func tryLock(*os.File) (bool, error) { return false, nil }
