package wire

import (
	"encoding/json"
	"fmt"

	"github.com/convlog/convlog/log/record"
)

// Error codes of the {"error":{"code":...}} body. Each has one status.
const (
	CodeBadRequest           = "bad_request"            // 400: the body is not a valid delivery
	CodeInvalidName          = "invalid_name"           // 400: agent, instance or session name
	CodeInvalidOffset        = "invalid_offset"         // 400: an offset not of our making
	CodeUnknownOffset        = "unknown_offset"         // 400: an offset this incarnation never produced
	CodeInvalidLimit         = "invalid_limit"          // 400: limit outside 1..10000
	CodeInvalidWait          = "invalid_wait"           // 400: wait not a duration in 0..60s
	CodeUnauthorized         = "unauthorized"           // 401: no bearer token, or one that proves nothing
	CodeForbidden            = "forbidden"              // 403: a valid token whose scopes do not allow this
	CodeNotFound             = "not_found"              // 404: unknown agent, submission or route
	CodeMethodNotAllowed     = "method_not_allowed"     // 405
	CodeNotAcceptable        = "not_acceptable"         // 406: no stream format the Accept header allows
	CodeSessionBusy          = "session_busy"           // 409: the agent rejects deliveries to a busy session
	CodeTurnLimitReached     = "turn_limit_reached"     // 409: the session has had its agent's maxTurns deliveries
	CodeAlreadySettled       = "already_settled"        // 409: abort of a settled submission
	CodeNotWaiting           = "not_waiting"            // 409: a decision for a submission that waits for none
	CodeAlreadyDecided       = "already_decided"        // 409: a decision for an approval decided already (the first stands)
	CodeReaderTooSlow        = "reader_too_slow"        // SSE final frame: a live reader fell MaxLag records behind
	CodePayloadTooLarge      = "payload_too_large"      // 413
	CodeUnsupportedMediaType = "unsupported_media_type" // 415
	CodeIdempotencyKeyReused = "idempotency_key_reused" // 422: same key, another request
	CodeRateLimited          = "rate_limited"           // 429: the principal's delivery rate or stream cap
	CodeInternal             = "internal"               // 500
	CodeShuttingDown         = "shutting_down"          // 503: the server no longer admits
	CodeUnavailable          = "unavailable"            // 503: the log is closed
	CodeNotReady             = "not_ready"              // 503: from /readyz
	// The lifecycle routes'.
	CodeStaleGeneration     = "stale_generation"     // 409: a delivery names a uid that is not the instance's current one
	CodeCannotRewind        = "cannot_rewind"        // 409: the entry is not (a user message) on the active path
	CodeConflict            = "conflict"             // 409: a fork into a conversation that exists
	CodeMutationInProgress  = "mutation_in_progress" // 409: another change to the conversation is running
	CodeInvalidCursor       = "invalid_cursor"       // 400: a listing cursor not of our making
	CodeInsufficientStorage = "insufficient_storage" // 507: the log's disk is full; nothing was stored
)

// APIError is an error as the API reports it, on the server (a handler
// returns one and the central error handler writes it) and in the client
// (decoded from a response or from an SSE error frame).
type APIError struct {
	// Status is the HTTP status; 0 for an error frame received in an SSE
	// stream, whose response had already started with 200.
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Incarnation comes with unknown_offset: the stream's current
	// incarnation, empty when the stream does not exist. A reader whose
	// offset belongs to an older incarnation restarts from record.Start.
	Incarnation record.Incarnation `json:"incarnation"`
	// Offset comes with reader_too_slow: where the reader resumes.
	Offset record.Offset `json:"offset,omitempty"`
	// UID comes with stale_generation: the instance's current generation,
	// empty (null on the wire) when it has none.
	UID string `json:"uid,omitempty"`

	// Cause is the server-side error behind it; never on the wire.
	Cause error `json:"-"`
}

func (e *APIError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
	}
	return e.Code + ": " + e.Message
}

// Unwrap gives the server-side cause, so that errors.Is(err,
// record.ErrUnknownOffset) works on the server. Decoded errors have none.
func (e *APIError) Unwrap() error { return e.Cause }

// MarshalJSON writes incarnation only where it means something: on
// unknown_offset, where it is always present (null for an absent stream).
func (e *APIError) MarshalJSON() ([]byte, error) {
	type plain struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	switch e.Code {
	case CodeUnknownOffset:
	case CodeStaleGeneration:
		var uid *string
		if e.UID != "" {
			uid = &e.UID
		}
		return json.Marshal(struct {
			plain
			UID *string `json:"uid"`
		}{plain{e.Code, e.Message}, uid})
	case CodeReaderTooSlow:
		return json.Marshal(struct {
			plain
			Offset record.Offset `json:"offset"`
		}{plain{e.Code, e.Message}, e.Offset})
	default:
		return json.Marshal(plain{e.Code, e.Message})
	}
	return json.Marshal(struct {
		plain
		Incarnation record.Incarnation `json:"incarnation"`
	}{plain{e.Code, e.Message}, e.Incarnation})
}
