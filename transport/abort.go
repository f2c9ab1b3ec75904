package transport

import (
	"net/http"

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
	if sub, err = s.opts.Conversations.Abort(c.Request().Context(), sub.ID); err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, sub)
}
