package transport

import (
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
)

// Observer is told about the server's work, for metrics. Its methods run
// on request goroutines and must not block.
type Observer interface {
	// Admission reports a delivery's outcome: AdmissionAdmitted,
	// AdmissionReplayed, or the error code it was refused with.
	Admission(outcome string)
	// AccessRefused reports a request refused by access control:
	// CodeUnauthorized, CodeForbidden, or CodeRateLimited with the limit
	// ("deliveries" or "streams").
	AccessRefused(code, limit string)
}

// Outcomes of a delivery besides the error codes.
const (
	AdmissionAdmitted = "admitted" // stored: a new submission
	AdmissionReplayed = "replayed" // an idempotent retry: the first admission's answer
)

// OpenStreams is the number of SSE streams open now.
func (s *Server) OpenStreams() int64 { return s.streams.Load() }

// StreamWrites is how many socket writes the SSE streams made and the
// bytes they carried, since the server started. A flush that carries
// several frames is one write.
func (s *Server) StreamWrites() (writes, bytes uint64) {
	return s.written.writes.Load(), s.written.bytes.Load()
}

func (s *Server) observeAdmission(err error, replayed bool) {
	if s.opts.Observer == nil {
		return
	}
	switch {
	case err == nil && replayed:
		s.opts.Observer.Admission(AdmissionReplayed)
	case err == nil:
		s.opts.Observer.Admission(AdmissionAdmitted)
	default:
		e, _ := toAPIError(err)
		s.opts.Observer.Admission(e.Code)
	}
}

// metrics is GET /metrics: the Prometheus exposition of Options.Metrics.
func (s *Server) metrics(c echo.Context) error {
	s.opts.Metrics.ServeHTTP(c.Response(), c.Request())
	return nil
}

// backup is POST /admin/backup: a consistent copy of the bbolt file, as of
// one read transaction, streamed while the service goes on. The response
// has the copy's exact Content-Length, so that a client can tell a
// complete copy from one cut short.
func (s *Server) backup(c echo.Context) error {
	resp := c.Response()
	started := false
	_, err := s.opts.Backup.Backup(c.Request().Context(), func(size int64) (io.Writer, error) {
		h := resp.Header()
		h.Set(echo.HeaderContentType, "application/octet-stream")
		h.Set(echo.HeaderContentLength, strconv.FormatInt(size, 10))
		h.Set(echo.HeaderContentDisposition, `attachment; filename="convlog.db"`)
		// No write deadline: a copy of a large file takes as long as the
		// reader takes.
		_ = http.NewResponseController(resp.Writer).SetWriteDeadline(time.Time{})
		resp.WriteHeader(http.StatusOK)
		started = true
		return resp, nil
	})
	if err != nil && started {
		// The status is out; the short body tells the client.
		s.log.WarnContext(c.Request().Context(), "backup cut short", "err", err)
		return nil
	}
	return err
}
