// Package natsbus is convlog's NATS plumbing: the embedded server and
// connections, the JetStream stream and consumer of admitted submissions
// (EnsureStream), the relay that publishes the log's outbox to it, the
// session leases in a KV bucket, and the bus that carries presentation
// deltas over core subjects. Every name it creates is prefixed by a
// Namespace, so deployments can share a broker.
//
// The log is the source of truth: JetStream is the doorbell that says a
// session has work.
package natsbus
