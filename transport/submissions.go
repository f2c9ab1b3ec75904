package transport

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// MaxWait bounds the long poll of GET .../submissions/:id?wait=.
const MaxWait = 60 * time.Second

// submission is GET /agents/:name/:instanceId/submissions/:submissionId:
// the submission's status (record.Submission's JSON). With ?wait=<duration>
// it waits until the submission is settled or the wait ends, then answers
// 200 with its state either way.
func (s *Server) submission(c echo.Context) error {
	wait, err := queryWait(c)
	if err != nil {
		return err
	}
	get, err := s.submissionOfRoute(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	sub, err := get()
	if err != nil {
		return err
	}
	if wait > 0 && !answered(sub) {
		// Outlive a server WriteTimeout shorter than the wait.
		_ = http.NewResponseController(c.Response().Writer).SetWriteDeadline(time.Now().Add(wait + 10*time.Second))
		timer := time.NewTimer(wait)
		defer timer.Stop()
	poll:
		for {
			// Subscribe, then re-check: a settlement is appended to the
			// stream in the transaction that changes the status, so it
			// closes changed even if it lands between the two.
			changed, release := s.db.Changed(sub.Key)
			sub, err = get()
			if err != nil || answered(sub) {
				release()
				if err != nil {
					return err
				}
				break
			}
			select {
			case <-changed:
				release()
			case <-timer.C:
				release()
				// The current state: a start changes the status without
				// appending, so it never woke us.
				if sub, err = get(); err != nil {
					return err
				}
				break poll
			case <-ctx.Done():
				release()
				return ctx.Err()
			case <-s.db.Done():
				release()
				break poll
			case <-s.closing:
				release()
				break poll
			}
		}
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return writeJSON(c, http.StatusOK, sub)
}

// answered is where a ?wait= long poll returns: the submission is
// settled, or waits for a person's decisions (input_required with pending
// approvals; once all are decided it resumes, and the poll goes on).
func answered(sub record.Submission) bool { return sub.Status.Terminal() || sub.Waiting() }

// queryWait is the wait parameter: a Go duration from 0 to MaxWait.
func queryWait(c echo.Context) (time.Duration, error) {
	vs, ok := c.QueryParams()["wait"]
	if !ok {
		return 0, nil
	}
	d, err := time.ParseDuration(vs[0])
	if err != nil || d < 0 || d > MaxWait {
		return 0, apiErr(http.StatusBadRequest, wire.CodeInvalidWait, "wait must be a duration from 0s to %s (like 30s), not %q", MaxWait, record.Clip(vs[0], 40))
	}
	return d, nil
}

// submissionOfRoute checks the route's agent and instance and returns a
// getter of the route's submission. Ids are global; the route scopes them:
// another instance's submission is as absent here as one that never was.
func (s *Server) submissionOfRoute(c echo.Context) (func() (record.Submission, error), error) {
	agent, instance, err := s.instance(c)
	if err != nil {
		return nil, err
	}
	id := pathParam(c, "submissionId")
	notFound := apiErr(http.StatusNotFound, wire.CodeNotFound, "no submission %q for %s/%s", record.Clip(id, 40), agent, instance)
	if len(id) > record.MaxIDLength {
		return nil, notFound
	}
	ctx := c.Request().Context()
	return func() (record.Submission, error) {
		sub, err := s.db.Submission(ctx, id)
		if err != nil {
			return sub, err
		}
		if sub.Key.Agent != agent || sub.Key.Instance != instance {
			return sub, notFound
		}
		return sub, nil
	}, nil
}
