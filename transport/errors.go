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

// errorBody is the wire envelope.
type errorBody struct {
	Error *wire.APIError `json:"error"`
}

func apiErr(status int, code, format string, args ...any) *wire.APIError {
	return &wire.APIError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *wire.APIError {
	return apiErr(http.StatusBadRequest, wire.CodeBadRequest, format, args...)
}

// unknownOffset builds the unknown_offset error of a failed read, with the
// incarnation an *log.OffsetError carries (none when the stream is absent).
func unknownOffset(err error) *wire.APIError {
	e := &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeUnknownOffset, Cause: err,
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
func toAPIError(err error) (e *wire.APIError, internal bool) {
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
		return &wire.APIError{Status: http.StatusRequestEntityTooLarge, Code: wire.CodePayloadTooLarge, Cause: err,
			Message: fmt.Sprintf("the request body is larger than %d bytes", mbe.Limit)}, false
	case errors.Is(err, log.ErrInvalidName):
		return &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrInvalidOffset):
		return &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidOffset, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrUnknownOffset):
		return unknownOffset(err), false
	case errors.Is(err, log.ErrSubmissionNotFound):
		return &wire.APIError{Status: http.StatusNotFound, Code: wire.CodeNotFound, Message: "no such submission", Cause: err}, false
	case errors.Is(err, conversation.ErrUnknownAgent):
		return &wire.APIError{Status: http.StatusNotFound, Code: wire.CodeNotFound, Message: err.Error(), Cause: err}, false
	case errors.Is(err, conversation.ErrChangeInProgress):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeMutationInProgress, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrSessionBusy):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeSessionBusy, Cause: err,
			Message: "the session has unsettled submissions and this agent rejects deliveries while busy"}, false
	case errors.Is(err, log.ErrTurnLimit):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeTurnLimitReached, Cause: err,
			Message: "the session has had its turns (the agent's maxTurns): " + err.Error()}, false
	case errors.As(err, new(*conversation.SettledError)):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeAlreadySettled, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrSubmissionSettled):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeAlreadySettled, Message: "the submission is already settled", Cause: err}, false
	case errors.Is(err, log.ErrNotWaiting):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeNotWaiting, Cause: err,
			Message: "the submission is not waiting for approvals"}, false
	case errors.Is(err, log.ErrUnknownApproval):
		return &wire.APIError{Status: http.StatusNotFound, Code: wire.CodeNotFound, Message: "no such approval for this submission", Cause: err}, false
	case errors.Is(err, log.ErrAlreadyDecided):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeAlreadyDecided, Cause: err,
			Message: "an approval of this request was decided already; the first decision stands"}, false
	case errors.Is(err, log.ErrIdempotencyKeyReused):
		return &wire.APIError{Status: http.StatusUnprocessableEntity, Code: wire.CodeIdempotencyKeyReused, Cause: err,
			Message: "this Idempotency-Key was used for another request"}, false
	case errors.Is(err, log.ErrStaleGeneration):
		e := &wire.APIError{Status: http.StatusConflict, Code: wire.CodeStaleGeneration, Cause: err,
			Message: "the delivery names a generation (uid) that is not the instance's current one"}
		var se *log.StaleGenerationError
		if errors.As(err, &se) {
			e.UID = se.Current
		}
		return e, false
	case errors.Is(err, log.ErrNotOnPath):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeCannotRewind, Message: err.Error(), Cause: err}, false
	case errors.Is(err, log.ErrUnknownEntry):
		return &wire.APIError{Status: http.StatusNotFound, Code: wire.CodeNotFound, Message: "no such entry in this conversation", Cause: err}, false
	case errors.Is(err, log.ErrConflict):
		return &wire.APIError{Status: http.StatusConflict, Code: wire.CodeConflict, Message: "the conversation to fork into exists", Cause: err}, false
	case errors.Is(err, log.ErrInstanceNotFound):
		return &wire.APIError{Status: http.StatusNotFound, Code: wire.CodeNotFound, Message: "no such conversation", Cause: err}, false
	case errors.Is(err, log.ErrInvalidRecord):
		// The only records this package writes are built from the request
		// and validated, so what is left is a message too large to store
		// once encoded. The engine's wording stays in the log.
		return &wire.APIError{Status: http.StatusRequestEntityTooLarge, Code: wire.CodePayloadTooLarge, Cause: err,
			Message: "the message is too large to store"}, false
	case errors.Is(err, log.ErrNoSpace):
		return &wire.APIError{Status: http.StatusInsufficientStorage, Code: wire.CodeInsufficientStorage, Cause: err,
			Message: "the server's disk is full: nothing was stored; retry later"}, false
	case errors.Is(err, log.ErrClosed):
		return &wire.APIError{Status: http.StatusServiceUnavailable, Code: wire.CodeUnavailable, Message: "the log is closed", Cause: err}, false
	}
	return &wire.APIError{Status: http.StatusInternalServerError, Code: wire.CodeInternal, Message: "internal error", Cause: err}, true
}

// fromHTTPError covers echo's own errors: the router's 404 and 405, and
// anything a middleware returns.
func fromHTTPError(he *echo.HTTPError, err error) (*wire.APIError, bool) {
	msg, _ := he.Message.(string)
	if msg == "" {
		msg = http.StatusText(he.Code)
	}
	e := &wire.APIError{Status: he.Code, Message: msg, Cause: err}
	switch he.Code {
	case http.StatusNotFound:
		e.Code, e.Message = wire.CodeNotFound, "no such route"
	case http.StatusMethodNotAllowed:
		e.Code, e.Message = wire.CodeMethodNotAllowed, "method not allowed on this route"
	case http.StatusNotAcceptable:
		e.Code = wire.CodeNotAcceptable
	case http.StatusRequestEntityTooLarge:
		e.Code = wire.CodePayloadTooLarge
	case http.StatusUnsupportedMediaType:
		e.Code = wire.CodeUnsupportedMediaType
	case http.StatusServiceUnavailable:
		e.Code = wire.CodeUnavailable
	default:
		if he.Code >= 500 || he.Code < 400 {
			e.Status, e.Code, e.Message = http.StatusInternalServerError, wire.CodeInternal, "internal error"
			return e, true
		}
		e.Code = wire.CodeBadRequest
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
