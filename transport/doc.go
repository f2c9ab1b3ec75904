// Package transport is convlog's HTTP face: the delivery route that durably
// admits messages, JSON polling and Server-Sent Events over a conversation's
// record stream, the submission status route, health checks, and a small Go
// client for all of them.
//
// It owns the wire protocol (request decoding and validation, the 202 body,
// the SSE frames, the JSON error shape) and nothing else: storage is the log
// package's, and what it needs from the worker side (which agents exist,
// live presentation deltas, the outbox kick after an admission) comes in
// through the small interfaces in server.go, which cmd/ wires up.
//
// Routes, relative to /agents/:name/:instanceId:
//
//	POST /agents/:name/:instanceId                         deliver a message (202)
//	GET  /agents/:name/:instanceId/conversation            read a page from an offset (JSON)
//	GET  /agents/:name/:instanceId/stream                  replay then tail (SSE)
//	GET  /agents/:name/:instanceId/submissions/:id         a submission's status (long poll with ?wait=)
//	GET  /healthz, /readyz                                 liveness and readiness
//
// A delivery body is
//
//	{"message": "text" | {"kind":"user", "body"?: "text", "parts"?: [text|file|data parts],
//	             "purpose"?: "user"|"dispatch"|"advisory", "display"?: "visible"|"hidden"|"diagnostic",
//	             "metadata"?: {...}},
//	 "session"?: "name", "initialData"?: any JSON, "uid"?: "string"}
//
// It becomes one user_message entry whose payload is log.MessagePayload:
// body first as a text part, then the parts. initialData and uid are kept
// in the payload's metadata object under the keys "initialData" and "uid"
// (a key given both there and at the top level is a 400). Unknown fields
// anywhere are a 400. An Idempotency-Key header makes a retry with the same
// bytes return the first 202 unchanged; with another body it is a 422.
//
// The SSE stream sends, after a ": connected" comment:
//
//	id: <offset after the batch>
//	data: {"type":"conversation","incarnation":"inc_…","offset":"<batch offset>","nextOffset":"<offset after it>","records":[…]}
//
// one per stored batch, the live frames of the DeltaSource as "data:" lines
// with no id (not resumable), ": keepalive" comments, and on an offset the
// stream's incarnation does not know (also after a reset) a last frame
// {"type":"error","code":"unknown_offset","message":…,"incarnation":…}.
// Reconnecting with Last-Event-ID (or offset=) set to the last id resumes
// with nothing lost or repeated.
//
// Every error is {"error":{"code":...,"message":...}} with the status of its
// code (see errors.go); unknown_offset also carries "incarnation", the
// stream's current one (null when it does not exist). An error after an SSE
// stream has started is sent in the stream instead.
package transport
