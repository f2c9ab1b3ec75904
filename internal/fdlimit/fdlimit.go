// Package fdlimit raises the process's open-file limit and derives from it
// how many long-lived connections (SSE streams) a server may hold while
// keeping descriptors for everything else.
package fdlimit

// Reserve is how many descriptors DefaultMaxStreams keeps for what is not
// a stream: deliveries, health checks, idle keep-alive connections, the
// log file, the broker's files and connections. An eighth of the limit,
// at least 256 and at most 8,192.
func Reserve(limit uint64) uint64 {
	return min(max(limit/8, 256), 8192)
}

// DefaultMaxStreams is the stream cap a server takes when none is given:
// the descriptor limit less Reserve, and at least 16 (a limit so low that
// the reserve eats it is then the operator's to raise).
func DefaultMaxStreams(limit uint64) int {
	r := Reserve(limit)
	if limit <= r+16 {
		return 16
	}
	return int(min(limit-r, 1<<30))
}
