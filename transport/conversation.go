package transport

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/convlog/convlog/log"
	"github.com/labstack/echo/v4"
)

// Page sizes of GET .../conversation, in records.
const (
	DefaultPageLimit = log.DefaultReadLimit
	MaxPageLimit     = log.MaxReadLimit
)

// conversation is GET /agents/:name/:instanceId/conversation: one page of
// the stream from offset, as log.ReadResult's JSON.
func (s *Server) conversation(c echo.Context) error {
	agent, instance, _, err := s.instance(c)
	if err != nil {
		return err
	}
	key, err := sessionKey(c, agent, instance)
	if err != nil {
		return err
	}
	offset, err := queryOffset(c)
	if err != nil {
		return err
	}
	limit, err := queryLimit(c)
	if err != nil {
		return err
	}
	res, err := s.db.Read(c.Request().Context(), key, offset, limit)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return c.JSONBlob(http.StatusOK, appendReadResult(make([]byte, 0, readResultSize(res)), res))
}

// queryLimit is the limit query parameter: 1..MaxPageLimit records,
// DefaultPageLimit when absent.
func queryLimit(c echo.Context) (int, error) {
	vs, ok := c.QueryParams()["limit"]
	if !ok {
		return DefaultPageLimit, nil
	}
	n, err := strconv.Atoi(vs[0])
	if err != nil || n < 1 || n > MaxPageLimit {
		return 0, apiErr(http.StatusBadRequest, CodeInvalidLimit, "limit must be an integer from 1 to %d, not %q", MaxPageLimit, clip(vs[0]))
	}
	return n, nil
}

// appendReadResult writes log.ReadResult's JSON by hand so that the stored
// record arrays are copied as they are: encoding/json would re-scan every
// byte of them to validate and compact what the log already wrote
// compactly.
func appendReadResult(b []byte, r log.ReadResult) []byte {
	b = append(b, `{"incarnation":`...)
	b = appendIncarnation(b, r.Incarnation)
	b = append(b, `,"batches":[`...)
	for i, bt := range r.Batches {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"offset":`...)
		b = appendString(b, string(bt.Offset))
		b = append(b, `,"records":`...)
		b = appendRecords(b, bt.Records)
		b = append(b, '}')
	}
	b = append(b, `],"nextOffset":`...)
	b = appendString(b, string(r.NextOffset))
	b = append(b, `,"upToDate":`...)
	b = strconv.AppendBool(b, r.UpToDate)
	return append(b, '}')
}

func readResultSize(r log.ReadResult) int {
	n := 128
	for _, bt := range r.Batches {
		n += len(bt.Records) + 48
	}
	return n
}

func appendRecords(b []byte, recs log.RawRecords) []byte {
	if len(recs) == 0 {
		return append(b, "[]"...)
	}
	return append(b, recs...)
}

func appendIncarnation(b []byte, inc log.Incarnation) []byte {
	if inc == "" {
		return append(b, "null"...)
	}
	return appendString(b, string(inc))
}

// appendString writes s as a JSON string. Offsets and incarnations are
// plain ASCII, but correctness does not depend on it.
func appendString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil { // cannot happen for a string
		return append(b, `""`...)
	}
	return append(b, q...)
}
