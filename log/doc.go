// Package log is convlog's storage engine: durable, append-only,
// offset-addressed record streams, one per conversation session, kept in a
// single bbolt file together with the submissions that feed them.
//
// The package owns the record types (Record, Entry and the payloads of the
// built-in entry types), stream addressing (Key, Offset, Incarnation), the
// submission lifecycle (admitted, running, settled) and the group committer
// that makes every write durable before it returns. It imports nothing else of
// convlog's and knows nothing of HTTP or NATS.
//
// The verbs are few: Admit, Append, Start, Settle, Reset, Read and Wait. Every
// write is one bbolt transaction shared with concurrent writers (group commit)
// and returns only after that transaction's fsync.
package log
