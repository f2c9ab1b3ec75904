package transport

import (
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
	agent, instance, _, err := s.instance(c)
	if err != nil {
		return err
	}
	id := pathParam(c, "submissionId")
	notFound := apiErr(http.StatusNotFound, CodeNotFound, "no submission %q for %s/%s", clip(id), agent, instance)
	if len(id) > log.MaxIDLength {
		return notFound
	}
	ctx := c.Request().Context()
	sub, err := s.db.Submission(ctx, id)
	if err != nil {
		return err
	}
	if sub.Key.Agent != agent || sub.Key.Instance != instance {
		return notFound
	}
	if sub, err = s.opts.Abort(ctx, id); err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, sub)
}
