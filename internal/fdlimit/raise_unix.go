//go:build unix

package fdlimit

import "syscall"

// Raise sets the soft RLIMIT_NOFILE to the hard limit, so that the server
// can hold as many connections as the system lets it, and returns the soft
// limit in force afterwards. The Go runtime does the same at start on most
// systems; doing it here makes it explicit and gives the figure to log and
// to derive the stream cap from. If the raise is refused (a hard limit
// above what the kernel allows a process, as macOS has), the limit stays
// as it was, returned with the error.
func Raise() (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if r.Cur >= r.Max {
		return uint64(r.Cur), nil
	}
	want := r
	want.Cur = r.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return uint64(r.Cur), err
	}
	return uint64(want.Cur), nil
}
