package transport

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"
)

// retryAfterSeconds is the Retry-After of the 503s above: long enough for
// in-flight requests to finish, short enough that a client does not wait
// for nothing.
const retryAfterSeconds = 1

// budget is a number of bytes that requests reserve while they hold them
// in memory. It refuses rather than waits: a client told 503 with
// Retry-After costs nothing, one queued holds a connection and a buffer.
type budget struct {
	limit int64
	used  atomic.Int64
}

// take reserves n bytes, or reports false and reserves nothing.
func (b *budget) take(n int64) bool {
	if n <= 0 {
		return true
	}
	// Alone, a request passes whatever its size (a page is at least one
	// batch, which may exceed a small budget): the bound is then the one
	// request.
	if now := b.used.Add(n); now > b.limit && now != n {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *budget) give(n int64) {
	if n > 0 {
		b.used.Add(-n)
	}
}

// errOverBudget ends a body read that would exceed the body budget.
var errOverBudget = errors.New("transport: body budget spent")

// budgetReader reserves a body's bytes as they arrive, for bodies of
// unknown length, in steps so that the counter is not touched per read.
type budgetReader struct {
	r     io.Reader
	b     *budget
	held  int64 // reserved
	seen  int64 // read
	limit int64 // the most it may reserve: MaxBody+1 (one byte over tells too large)
}

const budgetStep = 64 << 10

func (r *budgetReader) Read(p []byte) (int, error) {
	if r.seen+int64(len(p)) > r.held && r.held < r.limit {
		step := min(max(budgetStep, int64(len(p))), r.limit-r.held)
		if !r.b.take(step) {
			return 0, errOverBudget
		}
		r.held += step
	}
	room := r.held - r.seen
	if room <= 0 {
		return 0, errOverBudget // past MaxBody+1: the MaxBytesReader above stops first
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n, err := r.r.Read(p)
	r.seen += int64(n)
	return n, err
}

// overloaded is the 503 of a spent budget or a full stream table, with
// Retry-After; the connection closes, so that a client over the limit does
// not also keep a descriptor.
func overloaded(c echo.Context, code, format string, args ...any) *wire.APIError {
	h := c.Response().Header()
	h.Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	h.Set(echo.HeaderConnection, "close")
	return apiErr(http.StatusServiceUnavailable, code, format, args...)
}
