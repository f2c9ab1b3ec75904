package transport

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/convlog/convlog/log"
	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// conversation is GET /agents/:name/:instanceId/conversation: one page of
// the stream from offset, as record.ReadResult's JSON. With live=long-poll it
// waits (timeout=, default 30s) until there are records after offset.
func (s *Server) conversation(c echo.Context) error {
	agent, instance, err := s.instance(c)
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
	poll, wait, err := longPollParams(c)
	if err != nil {
		return err
	}
	var res record.ReadResult
	if poll {
		res, err = s.longPoll(c, key, offset, limit, wait)
	} else {
		res, err = s.db.Read(c.Request().Context(), key, offset, limit)
	}
	if err != nil {
		return err
	}
	var size int64
	for _, bt := range res.Batches {
		size += int64(len(bt.Records))
	}
	if !s.pages.take(size) {
		return overloaded(c, wire.CodeOverloaded, "the server holds its limit of pages being sent (%d bytes); retry shortly", s.opts.PageBudget)
	}
	defer s.pages.give(size)
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	var uid string
	if ll, ok := s.db.(LifecycleLog); ok && res.Incarnation != "" {
		// The generation first: {"uid":…, then the read's own fields.
		if uid, err = ll.Generation(c.Request().Context(), agent, instance); err != nil {
			return err
		}
	}
	return writeReadResult(c, res, uid)
}

// writeReadResult writes record.ReadResult's JSON by hand, and without
// building it whole: the stored record arrays go to the socket as they are
// (encoding/json would re-scan every byte of what the log already wrote
// compactly), so a page costs the memory of its records once, not twice,
// and a reader that does not read holds them only until the write
// deadline.
// A non-empty uid (the instance's generation) comes first.
func writeReadResult(c echo.Context, r record.ReadResult, uid string) error {
	glue := make([][]byte, len(r.Batches)+1) // what precedes each batch, and the tail
	n := 0
	head := []byte(`{`)
	if uid != "" {
		head = append(appendString(append(head, `"uid":`...), uid), ',')
	}
	head = appendIncarnation(append(head, `"incarnation":`...), r.Incarnation)
	head = append(head, `,"batches":[`...)
	for i, bt := range r.Batches {
		g := head[:0:0]
		if i == 0 {
			g = head
		} else {
			g = append(g, `},`...)
		}
		g = append(g, `{"offset":`...)
		g = appendString(g, string(bt.Offset))
		g = append(g, `,"records":`...)
		glue[i] = g
		n += len(g) + max(len(bt.Records), 2)
	}
	tail := head[:0:0]
	if len(r.Batches) == 0 {
		tail = head
	} else {
		tail = append(tail, '}')
	}
	tail = append(tail, `],"nextOffset":`...)
	tail = appendString(tail, string(r.NextOffset))
	tail = append(tail, `,"upToDate":`...)
	tail = strconv.AppendBool(tail, r.UpToDate)
	tail = append(tail, '}')
	glue[len(r.Batches)] = tail
	n += len(tail)

	res := c.Response()
	res.Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	res.Header().Set(echo.HeaderContentLength, strconv.Itoa(n))
	res.WriteHeader(http.StatusOK)
	// Small pieces gather in the buffer; a record array larger than it
	// goes to the socket directly, uncopied.
	w := bufio.NewWriterSize(res, 16<<10)
	for i, bt := range r.Batches {
		w.Write(glue[i])
		if len(bt.Records) == 0 {
			w.WriteString("[]")
		} else {
			w.Write(bt.Records)
		}
	}
	w.Write(tail)
	// A failed write is a client that left or stalled past the deadline:
	// nothing to answer, the response has started.
	_ = w.Flush()
	return nil
}

// queryLimit is the limit query parameter: 1..MaxPageLimit records,
// DefaultPageLimit when absent.
func queryLimit(c echo.Context) (int, error) {
	vs, ok := c.QueryParams()["limit"]
	if !ok {
		return log.DefaultReadLimit, nil
	}
	n, err := strconv.Atoi(vs[0])
	if err != nil || n < 1 || n > log.MaxReadLimit {
		return 0, apiErr(http.StatusBadRequest, wire.CodeInvalidLimit, "limit must be an integer from 1 to %d, not %q", log.MaxReadLimit, record.Clip(vs[0], 40))
	}
	return n, nil
}

func appendRecords(b []byte, recs record.RawRecords) []byte {
	if len(recs) == 0 {
		return append(b, "[]"...)
	}
	return append(b, recs...)
}

func appendIncarnation(b []byte, inc record.Incarnation) []byte {
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
