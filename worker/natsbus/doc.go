// Package natsbus is convlog's NATS plumbing: the embedded server and
// connections, the JetStream stream and consumer of admitted submissions
// (EnsureStream), the relay that publishes the log's outbox to it, the
// session leases in a KV bucket, the bus that carries presentation deltas
// over core subjects, and the broker's access control: the embedded
// server's users and a worker's permissions (WorkerPermissions), and the
// Credentials a client presents. Every name it creates is prefixed by a
// Namespace, so deployments can share a broker.
//
// The log is the source of truth: JetStream is the doorbell that says a
// session has work.
package natsbus
