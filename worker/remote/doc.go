// Package remote lets agents run in processes other than the log's: a
// remote worker's pool reads and writes the log through Client, which
// asks the log's owner over NATS request/reply, and the owner answers with
// Server.
//
// A turn's writes are fenced and idempotent. Each carries the name of the
// session lease its writer holds (pool.Fence); the owner refuses it with
// ErrFenced unless the lease bucket still names that writer, so a worker
// whose lease lapsed (it was partitioned, or paused past the TTL) cannot
// write beside the worker that took the session over. The client fixes the
// ids of a write's entries once, before its first attempt, and retries the
// same request until it is answered: if a reply was lost after the commit,
// the retry finds its own entries (or its own starts and settlements)
// already in the log, and the owner answers it as the first attempt's
// success instead of writing twice.
//
// The owner also answers a conversation's records (a read) only to the
// holder of its session lease, and refuses a write whose fence names no
// lease (ErrNotLeaseHolder): the broker's permissions
// (natsbus.WorkerPermissions) decide who may ask at all, the lease which
// conversations a worker may see.
//
// The log is still the source of truth and the owner its only writer:
// JetStream carries the doorbells, the leases and these requests.
package remote
