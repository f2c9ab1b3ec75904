package transport

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"
)

// The error codes and APIError are package wire's, shared with the client.
//
//go:fix inline
type APIError = wire.APIError

// Error codes: see package wire.
//
//go:fix inline
const (
	CodeBadRequest           = wire.CodeBadRequest
	CodeInvalidName          = wire.CodeInvalidName
	CodeInvalidOffset        = wire.CodeInvalidOffset
	CodeUnknownOffset        = wire.CodeUnknownOffset
	CodeInvalidLimit         = wire.CodeInvalidLimit
	CodeInvalidWait          = wire.CodeInvalidWait
	CodeUnauthorized         = wire.CodeUnauthorized
	CodeForbidden            = wire.CodeForbidden
	CodeNotFound             = wire.CodeNotFound
	CodeMethodNotAllowed     = wire.CodeMethodNotAllowed
	CodeNotAcceptable        = wire.CodeNotAcceptable
	CodeSessionBusy          = wire.CodeSessionBusy
	CodeTurnLimitReached     = wire.CodeTurnLimitReached
	CodeAlreadySettled       = wire.CodeAlreadySettled
	CodeReaderTooSlow        = wire.CodeReaderTooSlow
	CodePayloadTooLarge      = wire.CodePayloadTooLarge
	CodeUnsupportedMediaType = wire.CodeUnsupportedMediaType
	CodeIdempotencyKeyReused = wire.CodeIdempotencyKeyReused
	CodeRateLimited          = wire.CodeRateLimited
	CodeInternal             = wire.CodeInternal
	CodeShuttingDown         = wire.CodeShuttingDown
	CodeUnavailable          = wire.CodeUnavailable
	CodeNotReady             = wire.CodeNotReady
	// The lifecycle routes' (lifecycle.go).
	CodeStaleGeneration     = wire.CodeStaleGeneration
	CodeCannotRewind        = wire.CodeCannotRewind
	CodeConflict            = wire.CodeConflict
	CodeMutationInProgress  = wire.CodeMutationInProgress
	CodeInvalidCursor       = wire.CodeInvalidCursor
	CodeInsufficientStorage = wire.CodeInsufficientStorage
)

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
	e := &APIError{Status: http.StatusBadRequest, Code: CodeUnknownOffset, Cause: err,
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
		return &APIError{Status: http.StatusRequestEntityTooLarge, Code: CodePayloadTooLarge, Cause: err,
			Message: fmt.Sprintf("the request body is larger than %d bytes", mbe.Limit)}, false
	case errors.Is(err, log.ErrInvalidName):
		return &APIError{Status: http.StatusBadRequest, Code: CodeInvalidName, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrInvalidOffset):
		return &APIError{Status: http.StatusBadRequest, Code: CodeInvalidOffset, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrUnknownOffset):
		return unknownOffset(err), false
	case errors.Is(err, log.ErrSubmissionNotFound):
		return &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: "no such submission", Cause: err}, false
	case errors.Is(err, conversation.ErrUnknownAgent):
		return &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: err.Error(), Cause: err}, false
	case errors.Is(err, conversation.ErrChangeInProgress):
		return &APIError{Status: http.StatusConflict, Code: CodeMutationInProgress, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrSessionBusy):
		return &APIError{Status: http.StatusConflict, Code: CodeSessionBusy, Cause: err,
			Message: "the session has unsettled submissions and this agent rejects deliveries while busy"}, false
	case errors.Is(err, log.ErrTurnLimit):
		return &APIError{Status: http.StatusConflict, Code: CodeTurnLimitReached, Cause: err,
			Message: "the session has had its turns (the agent's maxTurns): " + err.Error()}, false
	case errors.As(err, new(*conversation.SettledError)):
		return &APIError{Status: http.StatusConflict, Code: CodeAlreadySettled, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrSubmissionSettled):
		return &APIError{Status: http.StatusConflict, Code: CodeAlreadySettled, Message: "the submission is already settled", Cause: err}, false
	case errors.Is(err, log.ErrIdempotencyKeyReused):
		return &APIError{Status: http.StatusUnprocessableEntity, Code: CodeIdempotencyKeyReused, Cause: err,
			Message: "this Idempotency-Key was used for another request"}, false
	case errors.Is(err, log.ErrStaleGeneration):
		e := &APIError{Status: http.StatusConflict, Code: CodeStaleGeneration, Cause: err,
			Message: "the delivery names a generation (uid) that is not the instance's current one"}
		var se *log.StaleGenerationError
		if errors.As(err, &se) {
			e.UID = se.Current
		}
		return e, false
	case errors.Is(err, log.ErrNotOnPath):
		return &APIError{Status: http.StatusConflict, Code: CodeCannotRewind, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrUnknownEntry):
		return &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: "no such entry in this conversation", Cause: err}, false
	case errors.Is(err, log.ErrConflict):
		return &APIError{Status: http.StatusConflict, Code: CodeConflict, Message: "the conversation to fork into exists", Cause: err}, false
	case errors.Is(err, log.ErrInstanceNotFound):
		return &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: "no such conversation", Cause: err}, false
	case errors.Is(err, log.ErrInvalidRecord):
		// The only records this package writes are built from the request
		// and validated, so what is left is a message too large to store
		// once encoded. The engine's wording stays in the log.
		return &APIError{Status: http.StatusRequestEntityTooLarge, Code: CodePayloadTooLarge, Cause: err,
			Message: "the message is too large to store"}, false
	case errors.Is(err, log.ErrNoSpace):
		return &APIError{Status: http.StatusInsufficientStorage, Code: CodeInsufficientStorage, Cause: err,
			Message: "the server's disk is full: nothing was stored; retry later"}, false
	case errors.Is(err, log.ErrClosed):
		return &APIError{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: "the log is closed", Cause: err}, false
	}
	return &APIError{Status: http.StatusInternalServerError, Code: CodeInternal, Message: "internal error", Cause: err}, true
}

// fromHTTPError covers echo's own errors: the router's 404 and 405, and
// anything a middleware returns.
func fromHTTPError(he *echo.HTTPError, err error) (*APIError, bool) {
	msg, _ := he.Message.(string)
	if msg == "" {
		msg = http.StatusText(he.Code)
	}
	e := &APIError{Status: he.Code, Message: msg, Cause: err}
	switch he.Code {
	case http.StatusNotFound:
		e.Code, e.Message = CodeNotFound, "no such route"
	case http.StatusMethodNotAllowed:
		e.Code, e.Message = CodeMethodNotAllowed, "method not allowed on this route"
	case http.StatusNotAcceptable:
		e.Code = CodeNotAcceptable
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
