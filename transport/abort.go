package transport

import (
	"fmt"
	"net/http"

	"github.com/convlog/convlog/log"

	"github.com/labstack/echo/v4"
)

// abort is POST /agents/:name/:instanceId/submissions/:submissionId/abort.
// A submission not yet started is settled aborted without running; a
// running one has its turn cancelled and the answer comes once it has
// settled (promptly: agents must honour cancellation). 200 with the
// submission; 409 already_settled for a settled one; 404 for an unknown one.
func (s *Server) abort(c echo.Context) error {
	get, err := s.submissionOfRoute(c)
	if err != nil {
		return err
	}
	sub, err := get()
	if err != nil {
		return err
	}
	if sub, err = s.opts.Abort(c.Request().Context(), sub.ID); err != nil {
		return err
	}
	if sub.Status.Terminal() && sub.Status != log.StatusAborted {
		// The turn settled otherwise (completed, failed) before the abort
		// reached it: the abort lost the race and changed nothing, as for
		// a submission that was already settled when it came.
		return &APIError{Status: http.StatusConflict, Code: CodeAlreadySettled, Cause: log.ErrSubmissionSettled,
			Message: fmt.Sprintf("the submission settled %s before the abort took effect", sub.Status)}
	}
	return writeJSON(c, http.StatusOK, sub)
}
