package natsbus

// JetStream sizes of convlog's own resources. They bound what the embedded
// broker stores, so that its disk need is known (docs/operations.md) and a
// small volume does not refuse the stream outright, as a 1 GiB limit did
// on a 64 MiB volume. A doorbell is ~200 bytes stored and consumed at once;
// a lease entry ~200 bytes, one per session running a turn.
const (
	// SubmissionsStreamMaxBytes holds ~150,000 doorbells; past it the
	// oldest are dropped (a dropped doorbell is found by the pool's sweep).
	SubmissionsStreamMaxBytes = 32 << 20
	// LeaseBucketMaxBytes holds ~40,000 sessions' leases at once.
	LeaseBucketMaxBytes = 8 << 20
	// EmbeddedMaxStore is the embedded broker's whole file store: the
	// stream and the bucket with room for their block files' overhead.
	EmbeddedMaxStore = 64 << 20
)
