// Package worker runs the agents behind conversations. It owns the Agent
// Handler contract (Agent, Event), the built-in echo agent, the relay that
// publishes admitted submissions from the log's outbox to NATS JetStream,
// the pool that consumes them and runs one turn at a time per session, and
// the bus that carries presentation-only deltas over NATS core subjects.
//
// The log is the source of truth: JetStream is the doorbell that says a
// session has work, and every decision (is this submission still admitted?
// which ones does the next turn answer?) is taken from the log.
package worker
