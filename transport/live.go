package transport

import (
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// Live modes besides SSE: the stream as NDJSON (negotiated by Accept on
// GET .../stream) and the conversation page as a long poll (GET
// .../conversation?live=long-poll), for clients that cannot hold an event
// stream open.

const mimeNDJSON = "application/x-ndjson"

// streamTypes are the media types GET .../stream serves, in the order it
// prefers them.
var streamTypes = []string{"text/event-stream", mimeNDJSON}

// negotiateStream picks the stream's format from the Accept values: SSE
// (also for no Accept, */* and text/*) or NDJSON (also application/*); 406
// when the client accepts neither.
func negotiateStream(accept []string) (ndjson bool, err error) {
	type rng struct {
		typ string
		q   float64
	}
	var ranges []rng
	for _, v := range accept {
		for _, part := range strings.Split(v, ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			mt, params, perr := mime.ParseMediaType(part)
			if perr != nil {
				continue
			}
			q := 1.0
			if qs, ok := params["q"]; ok {
				if f, ferr := strconv.ParseFloat(qs, 64); ferr == nil {
					q = f
				}
			}
			ranges = append(ranges, rng{mt, q})
		}
	}
	if len(ranges) == 0 {
		return false, nil
	}
	sort.SliceStable(ranges, func(i, j int) bool { return ranges[i].q > ranges[j].q })
	for _, r := range ranges {
		if r.q <= 0 {
			continue
		}
		switch r.typ {
		case "text/event-stream", "*/*", "text/*":
			return false, nil
		case mimeNDJSON, "application/*":
			return true, nil
		}
	}
	return false, apiErr(http.StatusNotAcceptable, wire.CodeNotAcceptable, "this stream is served as %s; Accept allows none of them", strings.Join(streamTypes, " or "))
}

// Long polls of GET .../conversation.
const (
	liveLongPoll           = "long-poll"
	DefaultLongPollTimeout = 30 * time.Second
)

// longPollParams reads live= and timeout=: whether the request is a long
// poll and how long it may wait (at most MaxWait).
func longPollParams(c echo.Context) (bool, time.Duration, error) {
	q := c.QueryParams()
	live, hasLive := q["live"]
	if !hasLive {
		if _, ok := q["timeout"]; ok {
			return false, 0, badRequest("timeout applies only with live=long-poll")
		}
		return false, 0, nil
	}
	if live[0] != liveLongPoll {
		return false, 0, badRequest("live must be %q (for a stream, use GET .../stream), not %q", liveLongPoll, record.Clip(live[0], 40))
	}
	d := DefaultLongPollTimeout
	if vs, ok := q["timeout"]; ok {
		var err error
		d, err = time.ParseDuration(vs[0])
		if err != nil || d < 0 || d > MaxWait {
			return false, 0, apiErr(http.StatusBadRequest, wire.CodeInvalidWait, "timeout must be a duration from 0s to %s (like 30s), not %q", MaxWait, record.Clip(vs[0], 40))
		}
	}
	return true, d, nil
}

// longPoll reads a page, waiting up to d for records after offset when there
// are none yet. It answers like a plain read: the records, or upToDate with
// no batches when the wait ended first.
func (s *Server) longPoll(c echo.Context, key record.Key, offset record.Offset, limit int, d time.Duration) (record.ReadResult, error) {
	ctx := c.Request().Context()
	// Outlive a server WriteTimeout shorter than the wait.
	_ = http.NewResponseController(c.Response().Writer).SetWriteDeadline(time.Now().Add(d + 10*time.Second))
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		changed, release := s.db.Changed(key)
		res, err := s.db.Read(ctx, key, offset, limit)
		if err != nil || len(res.Batches) > 0 || !res.UpToDate {
			release()
			return res, err
		}
		select {
		case <-changed:
			release()
		case <-timer.C:
			release()
			return res, nil
		case <-ctx.Done():
			release()
			return res, ctx.Err()
		case <-s.db.Done():
			release()
			return res, nil
		case <-s.closing:
			release()
			return res, nil
		}
	}
}
