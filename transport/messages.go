package transport

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"
)

// FrameMessages is the type of the frames of the messages SSE stream: a
// full MessagesView.
const FrameMessages = "messages"

// CodeViewTooLarge refuses a projected view of a conversation longer than
// MaxViewRecords: read its records instead (the conversation route), which
// pages.
const CodeViewTooLarge = "view_too_large"

// MaxViewRecords bounds the records the server projects for one view, so
// that a view's memory is bounded like every other answer's.
const MaxViewRecords = 100_000

// MessagesView is the projection of a session's records, as the messages
// route returns it: what a UI shows, computed by the server with package
// projection, so that a client in any language needs no reducer.
type MessagesView struct {
	// Incarnation is the stream's; null when the stream does not exist.
	Incarnation record.Incarnation `json:"incarnation"`
	projection.View
	// NextOffset is where the records the view covers end: read or
	// stream the records from there to follow the conversation.
	NextOffset record.Offset `json:"nextOffset"`
}

// MarshalJSON writes an absent incarnation as null, like the other routes.
func (v MessagesView) MarshalJSON() ([]byte, error) { return v.marshal("") }

// marshal encodes the view, with a "type" member first when typ is set
// (the SSE frame): one encoding, no copy to add the member.
func (v MessagesView) marshal(typ string) ([]byte, error) {
	type plain struct {
		Type        string               `json:"type,omitempty"`
		Incarnation *record.Incarnation  `json:"incarnation"`
		Messages    []projection.Message `json:"messages"`
		Settlements []record.Settlement  `json:"settlements"`
		NextOffset  record.Offset        `json:"nextOffset"`
	}
	p := plain{Type: typ, Messages: v.Messages, Settlements: v.Settlements, NextOffset: v.NextOffset}
	if p.Messages == nil {
		p.Messages = []projection.Message{}
	}
	if p.Settlements == nil {
		p.Settlements = []record.Settlement{}
	}
	if v.Incarnation != "" {
		p.Incarnation = &v.Incarnation
	}
	return json.Marshal(p)
}

// messages is GET /agents/:name/:instanceId/messages: the projected view
// of the session, as JSON, or as SSE when the client accepts only
// text/event-stream (a full view per frame).
func (s *Server) messages(c echo.Context) error {
	agent, instance, err := s.instance(c)
	if err != nil {
		return err
	}
	key, err := sessionKey(c, agent, instance)
	if err != nil {
		return err
	}
	if wantsEventStream(c.Request().Header.Get(echo.HeaderAccept)) {
		return s.messagesStream(c, key)
	}
	// offset, when given, ends the view: the conversation as it was
	// before that offset (the 202's offset gives the view before the
	// delivery). By default the view goes to the tail.
	var upTo record.Offset
	if _, ok := c.QueryParams()["offset"]; ok {
		if upTo, err = queryOffset(c); err != nil {
			return err
		}
		if _, err := s.db.Read(c.Request().Context(), key, upTo, 1); err != nil {
			return err // unknown_offset names the current incarnation
		}
	}
	v, _, err := s.project(c, key, projection.NewProjector(), record.Start, upTo)
	if err != nil {
		return err
	}
	b, err := v.marshal("")
	if err != nil {
		return err
	}
	if err := s.checkViewSize(len(b)); err != nil {
		return err
	}
	// The page budget, as for the conversation's pages: a view is held
	// whole while a slow client takes it.
	if !s.pages.take(int64(len(b))) {
		return overloaded(c, wire.CodeOverloaded, "too many large answers are being written; retry shortly")
	}
	defer s.pages.give(int64(len(b)))
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, append(b, '\n'))
}

// checkViewSize refuses a view larger than MaxViewBytes.
func (s *Server) checkViewSize(n int) error {
	if n > s.opts.MaxViewBytes {
		return apiErr(http.StatusUnprocessableEntity, CodeViewTooLarge,
			"the view is %d bytes, more than the %d this server sends: read its records (the conversation route) instead", n, s.opts.MaxViewBytes)
	}
	return nil
}

// wantsEventStream: SSE when the client asks for text/event-stream before
// (or instead of) JSON, as EventSource does.
func wantsEventStream(accept string) bool {
	for _, r := range strings.Split(accept, ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(r))
		if err != nil {
			continue
		}
		switch mt {
		case "text/event-stream":
			return true
		case "application/json", "*/*", "application/*":
			return false
		}
	}
	return false
}

// project applies the records from offset to upTo ("" for the tail) to p
// and returns the view and the records applied. It reads page by page:
// only the projection is held, never the records.
func (s *Server) project(c echo.Context, key record.Key, p *projection.Projector, offset, upTo record.Offset) (MessagesView, int, error) {
	ctx := c.Request().Context()
	v := MessagesView{NextOffset: offset}
	applied := 0
	for {
		page, err := s.db.Read(ctx, key, v.NextOffset, streamPageLimit)
		if err != nil {
			return v, applied, err
		}
		if page.Incarnation != "" {
			v.Incarnation = page.Incarnation
		}
		for _, b := range page.Batches {
			if upTo != "" && b.Offset == upTo {
				v.NextOffset = upTo
				v.View = p.View()
				return v, applied, nil
			}
			recs, err := b.Records.Decode()
			if err != nil {
				return v, applied, err
			}
			applied += len(recs)
			if applied > MaxViewRecords {
				return v, applied, apiErr(http.StatusUnprocessableEntity, CodeViewTooLarge,
					"the conversation has more than %d records: read its records (the conversation route) instead", MaxViewRecords)
			}
			p.Apply(recs...)
		}
		v.NextOffset = page.NextOffset
		if page.UpToDate {
			v.View = p.View()
			return v, applied, nil
		}
	}
}

// messagesStream serves the view as SSE: a full MessagesView per frame,
// sent at once and then after every change (one frame per burst of new
// records, not one per batch), with the presentation frames of running
// turns in between, as on the record stream.
//
// A frame's id is its view's position, "<nextOffset>/<incarnation>": the
// incarnation is in it because a view is only current in its own, and a
// stream replaced at the same offset (reset and rewritten, restored from a
// backup) must not look unchanged to a reader resuming with that id. A
// frame replaces the previous one: a reset needs no special handling by
// the client (the next frame simply has the new incarnation), and an id
// the stream no longer matches makes the server send the full view.
func (s *Server) messagesStream(c echo.Context, key record.Key) error {
	req := c.Request()
	raw := req.Header.Get("Last-Event-ID")
	if raw == "" {
		if vs, ok := c.QueryParams()["offset"]; ok {
			raw = vs[0]
		}
	}
	var resume record.Offset
	var resumeInc record.Incarnation
	haveInc := false
	if raw != "" {
		off, inc, ok := strings.Cut(raw, "/")
		o, err := parseOffset(off)
		if err != nil {
			return err
		}
		resume, resumeInc, haveInc = o, record.Incarnation(inc), ok
	}
	endStream, err := s.beginStream(c)
	if err != nil {
		return err
	}
	defer endStream()
	var deltas DeltaCursor
	if s.opts.Deltas != nil {
		if cur, err := s.opts.Deltas.FollowDeltas(key); err == nil {
			defer cur.Close()
			deltas = cur
		}
	}
	res := c.Response()
	rc := http.NewResponseController(res.Writer)
	_ = rc.SetWriteDeadline(time.Time{})
	h := res.Header()
	h.Set(echo.HeaderContentType, "text/event-stream")
	h.Set(echo.HeaderCacheControl, "no-cache")
	h.Set("X-Accel-Buffering", "no")
	res.WriteHeader(http.StatusOK)
	w := &sseWriter{w: res, rc: rc, timeout: s.opts.WriteTimeout}
	defer w.release()
	w.comment("connected")
	if w.flush() != nil {
		return nil
	}
	heartbeat := time.NewTicker(s.opts.Heartbeat)
	defer heartbeat.Stop()

	p := projection.NewProjector()
	var v MessagesView
	v.NextOffset = record.Start
	send := resume == "" // a new reader gets the view at once
	first := true
	for {
		changed, release := s.db.Changed(key)
		nv, applied, err := s.project(c, key, p, v.NextOffset, "")
		if err != nil && errors.Is(err, log.ErrUnknownOffset) || err == nil && v.Incarnation != "" && nv.Incarnation != v.Incarnation {
			// Reset under us: start over, and send the new view whole.
			release()
			p, v, send, first = projection.NewProjector(), MessagesView{NextOffset: record.Start}, true, false
			continue
		}
		if err != nil {
			release()
			s.endStream(c.Request().Context(), c.Request().URL.Path, w, err)
			return nil
		}
		switch {
		case first && resume != "":
			// The reader has the view up to resume: send only if ours
			// ends elsewhere (it is behind, or from another incarnation).
			send = send || nv.NextOffset != resume || haveInc && nv.Incarnation != resumeInc
		case applied > 0:
			send = true
		}
		first = false
		v = nv
		held := int64(0)
		if send {
			b, err := v.marshal(FrameMessages)
			if err != nil {
				release()
				return err
			}
			if err := s.checkViewSize(len(b)); err != nil {
				release()
				s.endStream(c.Request().Context(), c.Request().URL.Path, w, err)
				return nil
			}
			// Every reader holds its frame until its client takes it: the
			// frames being written share the page budget with JSON pages,
			// so readers that do not read cannot grow memory without
			// bound. Over it the stream ends; the client resumes from its
			// last frame's id.
			if !s.pages.take(int64(len(b))) {
				release()
				s.endStream(c.Request().Context(), c.Request().URL.Path, w,
					apiErr(http.StatusServiceUnavailable, wire.CodeOverloaded, "too many large views are being written; resume shortly"))
				return nil
			}
			held = int64(len(b))
			w.event(viewID(v), b)
			send = false
		}
		err = w.flush()
		s.pages.give(held)
		w.shrink()
		if err != nil {
			release()
			return nil
		}
		principal, _ := PrincipalOf(c)
		ok := s.waitTail(c.Request().Context(), w, changed, deltas, heartbeat.C, principal)
		release()
		if !ok {
			return nil
		}
	}
}

// viewID is the SSE id of a view's frame: "<nextOffset>/<incarnation>".
func viewID(v MessagesView) string { return string(v.NextOffset) + "/" + string(v.Incarnation) }
