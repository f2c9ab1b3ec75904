package transport

import (
	"net/http"

	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"
)

// healthz is GET /healthz: the process serves HTTP. It checks nothing else,
// so that a supervisor restarts only a process that cannot answer at all.
func (s *Server) healthz(c echo.Context) error {
	return writeJSON(c, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is GET /readyz: whether to send traffic here. Not ready while the
// log is closed, once admission has stopped (a graceful stop drains the
// instance first), or while Options.Ready says so.
func (s *Server) readyz(c echo.Context) error {
	notReady := func(msg string) error {
		return apiErr(http.StatusServiceUnavailable, wire.CodeNotReady, "%s", msg)
	}
	select {
	case <-s.db.Done():
		return notReady("the log is closed")
	default:
	}
	if s.stopAd.Load() {
		return notReady("the server is shutting down")
	}
	if s.opts.Ready != nil {
		if err := s.opts.Ready.Ready(); err != nil {
			return notReady(err.Error())
		}
	}
	return writeJSON(c, http.StatusOK, map[string]string{"status": "ready"})
}
