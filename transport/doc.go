// Package transport is convlog's HTTP face: the delivery route that durably
// admits messages, JSON polling and Server-Sent Events over a conversation's
// record stream, the submission status and abort routes and health checks.
//
// It owns the wire protocol (request decoding and validation, the 202 body,
// the SSE frames, the JSON error shape) and nothing else: storage is the log
// package's, and what it needs from the worker side (which agents exist,
// live presentation deltas, the outbox kick after an admission) comes in
// through the small interfaces in server.go, which internal/service wires up.
//
// The client adapters (aisdk.go, agui.go, a2a.go, docs/adapters.md) serve
// the same conversations to the Vercel AI SDK's useChat, to AG-UI and to
// A2A 1.0 callers. They are views, not copies: the turn view (package
// internal/conversation/turnview) derives one submission's answer from the
// log and the live deltas (wire.DeltaFrame), and each adapter only encodes
// its events in its client's format. The live modes of live.go (NDJSON streams, long-poll
// pages) serve the same frames and pages as SSE and polling.
//
// docs/protocol.md is the reference of every route, frame and error, with
// real requests and responses; its examples are run by tests. The Go client
// is package transport/client, and the JSON shapes it shares with the
// server are package transport/wire.
//
// The lifecycle routes (lifecycle.go) list instances, sessions and
// checkpoints and rewind, regenerate, fork, reset and delete
// conversations: each change is one log transaction that leaves its record
// in the stream, changes of one session are refused (409
// mutation_in_progress) while another runs, and Idempotency-Key works as
// for deliveries.
//
// The binary also serves the web console (/console, package
// transport/console) and the JS client it runs on (/client/, package
// transport/jsclient): static files embedded at build time (static.go).
package transport
