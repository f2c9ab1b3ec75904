// Package log is convlog's storage engine: durable, append-only,
// offset-addressed record streams, one per conversation session, kept in a
// single bbolt file together with the submissions that feed them.
//
// The record types (Record, Entry, the payloads of the built-in entry types,
// Key, Offset, Incarnation, Submission) are package log/record's, which a
// reader imports without this engine; this package owns storing them: stream
// addressing, the submission lifecycle (admitted, running, input_required
// while it waits for approval decisions, settled) and the group committer
// that makes every write durable before it returns. It imports nothing of
// convlog's but log/record and knows nothing of HTTP or NATS.
//
// The verbs:
//   - writes: Admit (a delivery and its submission), Write (records,
//     submission starts, awaits and settlements in one transaction; Append
//     is its records-only form), Decide (approval decisions), Reset (a new
//     incarnation), ExpireIdempotencyKeys;
//   - reads: Read (a page from an offset), Tail, Submission, Pending,
//     Unsettled, Unpublished and MarkPublished (the outbox);
//   - waiting: Wait, Changed, Done.
//
// Every write is one bbolt transaction shared with concurrent writers (group
// commit) and returns only after that transaction's fsync.
package log
