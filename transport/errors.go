package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/convlog/convlog/log"
	"github.com/labstack/echo/v4"
)

// Error codes of the {"error":{"code":...}} body. Each has one status.
const (
	CodeBadRequest           = "bad_request"            // 400: the body is not a valid delivery
	CodeInvalidName          = "invalid_name"           // 400: agent, instance or session name
	CodeInvalidOffset        = "invalid_offset"         // 400: an offset not of our making
	CodeUnknownOffset        = "unknown_offset"         // 400: an offset this incarnation never produced
	CodeInvalidLimit         = "invalid_limit"          // 400: limit outside 1..10000
	CodeInvalidWait          = "invalid_wait"           // 400: wait not a duration in 0..60s
	CodeNotFound             = "not_found"              // 404: unknown agent, submission or route
	CodeMethodNotAllowed     = "method_not_allowed"     // 405
	CodeSessionBusy          = "session_busy"           // 409: the agent rejects deliveries to a busy session
	CodeAlreadySettled       = "already_settled"        // 409: abort of a settled submission
	CodeReaderTooSlow        = "reader_too_slow"        // SSE final frame: a live reader fell MaxLag records behind
	CodePayloadTooLarge      = "payload_too_large"      // 413
	CodeUnsupportedMediaType = "unsupported_media_type" // 415
	CodeIdempotencyKeyReused = "idempotency_key_reused" // 422: same key, another request
	CodeInternal             = "internal"               // 500
	CodeShuttingDown         = "shutting_down"          // 503: the server no longer admits
	CodeUnavailable          = "unavailable"            // 503: the log is closed
	CodeNotReady             = "not_ready"              // 503: from /readyz
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
	// offset belongs to an older incarnation restarts from log.Start.
	Incarnation log.Incarnation `json:"incarnation"`
	// Offset comes with reader_too_slow: where the reader resumes.
	Offset log.Offset `json:"offset,omitempty"`

	cause error
}

func (e *APIError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
	}
	return e.Code + ": " + e.Message
}

// Unwrap gives the server-side cause, so that errors.Is(err,
// log.ErrUnknownOffset) works on the server. Decoded errors have none.
func (e *APIError) Unwrap() error { return e.cause }

// MarshalJSON writes incarnation only where it means something: on
// unknown_offset, where it is always present (null for an absent stream).
func (e *APIError) MarshalJSON() ([]byte, error) {
	type plain struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	switch e.Code {
	case CodeUnknownOffset:
	case CodeReaderTooSlow:
		return json.Marshal(struct {
			plain
			Offset log.Offset `json:"offset"`
		}{plain{e.Code, e.Message}, e.Offset})
	default:
		return json.Marshal(plain{e.Code, e.Message})
	}
	return json.Marshal(struct {
		plain
		Incarnation log.Incarnation `json:"incarnation"`
	}{plain{e.Code, e.Message}, e.Incarnation})
}

// errorBody is the wire envelope.
type errorBody struct {
	Error *APIError `json:"error"`
}

func apiErr(status int, code, format string, args ...any) *APIError {
	return &APIError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *APIError {
	return apiErr(http.StatusBadRequest, CodeBadRequest, format, args...)
}

// unknownOffset builds the unknown_offset error of a failed read, with the
// incarnation an *log.OffsetError carries (none when the stream is absent).
func unknownOffset(err error) *APIError {
	e := &APIError{Status: http.StatusBadRequest, Code: CodeUnknownOffset, cause: err,
		Message: "the offset was not produced by this stream's current incarnation; restart from offset 0"}
	var oe *log.OffsetError
	if errors.As(err, &oe) {
		e.Incarnation = oe.Incarnation
	} else {
		e.Message = "the offset was not produced by this stream, which does not exist; read from offset 0"
	}
	return e
}

// toAPIError maps any error a handler returns to what the client sees.
// Client mistakes are recognised by their types and sentinels; whatever is
// left is a 500 whose detail goes to the log, not to the client.
func toAPIError(err error) (e *APIError, internal bool) {
	if errors.As(err, &e) {
		return e, false
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return fromHTTPError(he, err)
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return &APIError{Status: http.StatusRequestEntityTooLarge, Code: CodePayloadTooLarge, cause: err,
			Message: fmt.Sprintf("the request body is larger than %d bytes", mbe.Limit)}, false
	case errors.Is(err, log.ErrInvalidName):
		return &APIError{Status: http.StatusBadRequest, Code: CodeInvalidName, Message: err.Error(), cause: err}, false
	case errors.Is(err, log.ErrInvalidOffset):
		return &APIError{Status: http.StatusBadRequest, Code: CodeInvalidOffset, Message: err.Error(), cause: err}, false
	case errors.Is(err, log.ErrUnknownOffset):
		return unknownOffset(err), false
	case errors.Is(err, log.ErrSubmissionNotFound):
		return &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: "no such submission", cause: err}, false
	case errors.Is(err, log.ErrSessionBusy):
		return &APIError{Status: http.StatusConflict, Code: CodeSessionBusy, cause: err,
			Message: "the session has unsettled submissions and this agent rejects deliveries while busy"}, false
	case errors.Is(err, log.ErrSubmissionSettled):
		return &APIError{Status: http.StatusConflict, Code: CodeAlreadySettled, Message: "the submission is already settled", cause: err}, false
	case errors.Is(err, log.ErrIdempotencyKeyReused):
		return &APIError{Status: http.StatusUnprocessableEntity, Code: CodeIdempotencyKeyReused, cause: err,
			Message: "this Idempotency-Key was used for another request"}, false
	case errors.Is(err, log.ErrInvalidRecord):
		// The only records this package writes are built from the request,
		// so a refusal is about what the client sent (a batch too large).
		return &APIError{Status: http.StatusBadRequest, Code: CodeBadRequest, Message: err.Error(), cause: err}, false
	case errors.Is(err, log.ErrClosed):
		return &APIError{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: "the log is closed", cause: err}, false
	}
	return &APIError{Status: http.StatusInternalServerError, Code: CodeInternal, Message: "internal error", cause: err}, true
}

// fromHTTPError covers echo's own errors: the router's 404 and 405, and
// anything a middleware returns.
func fromHTTPError(he *echo.HTTPError, err error) (*APIError, bool) {
	msg, _ := he.Message.(string)
	if msg == "" {
		msg = http.StatusText(he.Code)
	}
	e := &APIError{Status: he.Code, Message: msg, cause: err}
	switch he.Code {
	case http.StatusNotFound:
		e.Code, e.Message = CodeNotFound, "no such route"
	case http.StatusMethodNotAllowed:
		e.Code, e.Message = CodeMethodNotAllowed, "method not allowed on this route"
	case http.StatusRequestEntityTooLarge:
		e.Code = CodePayloadTooLarge
	case http.StatusUnsupportedMediaType:
		e.Code = CodeUnsupportedMediaType
	case http.StatusServiceUnavailable:
		e.Code = CodeUnavailable
	default:
		if he.Code >= 500 || he.Code < 400 {
			e.Status, e.Code, e.Message = http.StatusInternalServerError, CodeInternal, "internal error"
			return e, true
		}
		e.Code = CodeBadRequest
	}
	return e, false
}

// handleError is echo's HTTPErrorHandler: the one place errors become
// responses.
func (s *Server) handleError(err error, c echo.Context) {
	// Once a stream has started its status is sent; its errors travel in
	// the stream, and there is nothing left to say here.
	if c.Response().Committed {
		return
	}
	req := c.Request()
	// A client that went away reads nothing.
	if req.Context().Err() != nil && errors.Is(err, req.Context().Err()) {
		return
	}
	e, internal := toAPIError(err)
	if internal {
		s.log.ErrorContext(req.Context(), "request failed", "method", req.Method, "path", req.URL.Path, "err", err)
	}
	if req.Method == http.MethodHead {
		err = c.NoContent(e.Status)
	} else {
		err = writeJSON(c, e.Status, errorBody{e})
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.DebugContext(req.Context(), "writing error response", "err", err)
	}
}
