//go:build !unix && !windows

package log

import "errors"

func freeSpace(string) (uint64, error) {
	return 0, errors.New("free disk space: not supported on this system")
}
