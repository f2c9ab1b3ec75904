package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/convlog/convlog/log"
)

// The adapters (AI SDK, AG-UI, A2A) each show one submission's answer in
// their client's format. They share turnView, which derives that answer
// from the same two sources the SSE stream serves: the log, from the
// submission's offset, and the live delta frames of the turn that answers
// it. Nothing is kept besides what one request is writing.
//
// The answer is a sequence of segments: the worker records the assistant
// message so far each time the agent starts a tool call, and the rest with
// the settlement. Text deltas are not durable until their segment is
// recorded, so the view emits a segment's text live only when it has
// followed the deltas since that segment began (a POST that admitted the
// submission, a reader that connected before the turn started, or the
// segments after a tool call it saw); otherwise the segment's text comes
// whole when it is recorded. Either way the record is the truth: when a
// segment is recorded the view completes what the deltas left out, so a
// reader gets the whole answer exactly once.

// Operations of a viewEvent.
const (
	opStart      = "start"       // the view begins: Sub is the submission
	opPartStart  = "part-start"  // a text or reasoning part begins: Kind, ID
	opPartDelta  = "part-delta"  // Kind, ID, Delta
	opPartEnd    = "part-end"    // Kind, ID
	opToolCall   = "tool-call"   // ID, ToolName, Input
	opToolResult = "tool-result" // ID, ToolName, Output, IsError
	opFinish     = "finish"      // Outcome, Failure (nil on success)
)

// Kinds of a part event.
const (
	kindText      = log.PartText
	kindReasoning = log.PartReasoning
)

// viewEvent is one step of a submission's answer, in no client's format.
type viewEvent struct {
	Op       string
	Kind     string
	ID       string
	Delta    string
	ToolName string
	Input    json.RawMessage
	Output   json.RawMessage
	IsError  bool
	Outcome  log.Outcome
	Failure  *log.Failure
	Sub      log.Submission
}

// viewSink is an adapter's encoder: emit buffers an event, flush sends what
// was buffered (and is where a write error surfaces), keepalive keeps an
// idle connection proven alive.
type viewSink interface {
	emit(ev viewEvent)
	keepalive()
	flush() error
}

// errViewReset ends a view whose stream was reset under it.
var errViewReset = errors.New("the conversation was reset while its answer was being read")

// deltaFrame is the part of a worker presentation frame the view reads.
type deltaFrame struct {
	Type       string `json:"type"`
	TurnID     string `json:"turnId"`
	Kind       string `json:"kind"`
	Delta      string `json:"delta"`
	ToolCallID string `json:"toolCallId"`
}

// Presentation frame types the view understands (the worker's).
const (
	frameDelta    = "delta"
	frameToolCall = "toolcall_delta"
)

// maxPendingLive bounds the live text a view holds for a segment whose
// predecessor is not recorded yet; past it the segment's text comes whole
// from its record.
const maxPendingLive = 1 << 20

type livePart struct {
	kind, id, text string
	open           bool
}

type turnView struct {
	s      *Server
	key    log.Key
	sub    log.Submission
	sink   viewSink
	cursor DeltaCursor // nil: the log only
	// snapshot stops at the log's tail instead of waiting for the end.
	snapshot bool

	turnID string
	others map[string]bool // turn ids known not to answer sub

	segs     int            // recorded segments of the turn processed
	toolSeg  map[string]int // tool call id -> its recorded segment
	liveSeg  int            // the segment the deltas are in; -1 unknown
	waitTool string         // a tool call seen live, not yet recorded
	pending  []deltaFrame   // deltas after waitTool
	pendLen  int
	cur      []livePart // live parts of segment segs
	done     bool
}

// newTurnView prepares the view of sub. fresh says that cursor followed the
// deltas before the turn answering sub could have published any.
func (s *Server) newTurnView(key log.Key, sub log.Submission, cursor DeltaCursor, fresh bool, sink viewSink) *turnView {
	v := &turnView{s: s, key: key, sub: sub, sink: sink, cursor: cursor, turnID: sub.TurnID,
		others: map[string]bool{}, toolSeg: map[string]int{}, liveSeg: -1}
	if fresh {
		v.liveSeg = 0
	}
	return v
}

// followDeltas opens a delta cursor for key, or nil when there is no source
// or it fails (the view then serves the log alone).
func (s *Server) followDeltas(ctx context.Context, key log.Key) DeltaCursor {
	if s.opts.Deltas == nil {
		return nil
	}
	cur, err := s.opts.Deltas.FollowDeltas(key)
	if err != nil {
		s.log.WarnContext(ctx, "following deltas", "key", key.String(), "err", err)
		return nil
	}
	return cur
}

// run emits the answer until the submission settles (or, in snapshot mode,
// until the log's tail). It returns nil when the answer ended or the client
// left, an error when the stream cannot go on (errViewReset, a read error)
// or a write failed. Shutdown ends it early with errViewStopped.
func (v *turnView) run(ctx context.Context) error {
	v.sink.emit(viewEvent{Op: opStart, Sub: v.sub})
	offset := v.sub.Offset
	var inc log.Incarnation
	var heartbeat <-chan time.Time
	if !v.snapshot {
		t := time.NewTicker(v.s.opts.Heartbeat)
		defer t.Stop()
		heartbeat = t.C
	}
	var frames [][]byte
	for {
		changed, release := v.s.db.Changed(v.key)
		// Frames before the read: a record that precedes a frame causally
		// (a segment recorded before the next one's deltas) is then read
		// before that frame is applied.
		frames = frames[:0]
		if v.cursor != nil {
			frames = v.cursor.Next(frames)
		}
		for !v.done {
			page, err := v.s.db.Read(ctx, v.key, offset, streamPageLimit)
			if err != nil {
				release()
				if errors.Is(err, log.ErrUnknownOffset) {
					return errViewReset
				}
				return err
			}
			if page.Incarnation != "" {
				if inc != "" && inc != page.Incarnation {
					release()
					return errViewReset
				}
				inc = page.Incarnation
			}
			for _, b := range page.Batches {
				recs, err := b.Records.Decode()
				if err != nil {
					release()
					return err
				}
				for _, r := range recs {
					if err := v.record(ctx, r); err != nil {
						release()
						return err
					}
					if v.done {
						break
					}
				}
				if v.done {
					break
				}
			}
			offset = page.NextOffset
			if page.UpToDate {
				break
			}
		}
		if !v.done {
			for _, f := range frames {
				v.frame(ctx, f)
			}
		}
		clear(frames)
		if err := v.sink.flush(); err != nil || v.done || v.snapshot {
			release()
			return err
		}
		var ready <-chan struct{}
		if v.cursor != nil {
			ready = v.cursor.Ready()
		}
	wait:
		for {
			select {
			case <-changed:
			case <-ready:
			case <-heartbeat:
				v.sink.keepalive()
				if err := v.sink.flush(); err != nil {
					release()
					return err
				}
				continue wait
			case <-ctx.Done():
				release()
				return nil
			case <-v.s.db.Done():
				release()
				return errViewStopped
			case <-v.s.closing:
				release()
				return errViewStopped
			}
			break
		}
		release()
	}
}

// errViewStopped ends a view because the server or the log is stopping; the
// client resumes elsewhere.
var errViewStopped = errors.New("the server is shutting down")

// ours reports whether turn id answers the view's submission, learning the
// submission's turn from the log when it is not known yet.
func (v *turnView) ours(ctx context.Context, id string) bool {
	if id == "" {
		return false
	}
	if v.turnID != "" {
		return id == v.turnID
	}
	if v.others[id] {
		return false
	}
	// A turn that publishes or records for the submission has started it,
	// and its start is in the log before its first frame or record.
	if sub, err := v.s.db.Submission(ctx, v.sub.ID); err == nil && sub.TurnID != "" {
		v.turnID = sub.TurnID
		return id == v.turnID
	}
	v.others[id] = true
	return false
}

func (v *turnView) record(ctx context.Context, r log.Record) error {
	if r.Kind != log.KindEntry || r.Entry == nil {
		return nil
	}
	e := r.Entry
	switch e.Type {
	case log.EntrySettlement:
		var st log.Settlement
		if json.Unmarshal(e.Payload, &st) != nil || st.SubmissionID != v.sub.ID {
			return nil
		}
		v.endLive()
		v.sink.emit(viewEvent{Op: opFinish, Outcome: st.Outcome, Failure: st.Error, Sub: v.sub})
		v.done = true
	case log.EntryAssistantMessage:
		if e.SubmissionID == v.sub.ID && v.turnID == "" && e.TurnID != "" {
			v.turnID = e.TurnID
		}
		if !v.ours(ctx, e.TurnID) {
			return nil
		}
		var m log.MessagePayload
		if err := json.Unmarshal(e.Payload, &m); err != nil {
			return fmt.Errorf("assistant message %s: %w", e.ID, err)
		}
		v.segment(m.Parts)
	case log.EntryToolResult:
		if !v.ours(ctx, e.TurnID) {
			return nil
		}
		var tr log.ToolResultPayload
		if err := json.Unmarshal(e.Payload, &tr); err != nil {
			return fmt.Errorf("tool result %s: %w", e.ID, err)
		}
		v.sink.emit(viewEvent{Op: opToolResult, ID: tr.ToolCallID, ToolName: tr.ToolName, Output: tr.Output, IsError: tr.IsError})
	}
	return nil
}

// partID names part i of segment seg: the same on every replay, so a
// resumed client sees the ids it saw live.
func partID(seg, i int) string { return "p" + strconv.Itoa(seg) + "." + strconv.Itoa(i) }

// segment emits a recorded segment, completing what its live deltas left
// out, and makes the next segment the live one.
func (v *turnView) segment(parts []log.Part) {
	k := v.segs
	for i, p := range parts {
		switch p.Type {
		case log.PartText, log.PartReasoning:
			if i < len(v.cur) && v.cur[i].kind == p.Type && strings.HasPrefix(p.Text, v.cur[i].text) {
				lp := &v.cur[i]
				if !lp.open {
					// Ended live at a kind switch; what lost frames
					// dropped from it cannot be added after its end.
					continue
				}
				if rest := p.Text[len(lp.text):]; rest != "" {
					v.sink.emit(viewEvent{Op: opPartDelta, Kind: lp.kind, ID: lp.id, Delta: rest})
				}
				v.sink.emit(viewEvent{Op: opPartEnd, Kind: lp.kind, ID: lp.id})
				lp.open = false
				continue
			}
			v.endLive()
			id := partID(k, i)
			v.sink.emit(viewEvent{Op: opPartStart, Kind: p.Type, ID: id})
			if p.Text != "" {
				v.sink.emit(viewEvent{Op: opPartDelta, Kind: p.Type, ID: id, Delta: p.Text})
			}
			v.sink.emit(viewEvent{Op: opPartEnd, Kind: p.Type, ID: id})
		case log.PartToolCall:
			v.endLive()
			v.toolSeg[p.ToolCallID] = k
			v.sink.emit(viewEvent{Op: opToolCall, ID: p.ToolCallID, ToolName: p.ToolName, Input: p.Input})
		}
	}
	v.endLive()
	v.cur = v.cur[:0]
	v.segs = k + 1
	if v.waitTool != "" {
		if j, ok := v.toolSeg[v.waitTool]; ok {
			// The deltas since that tool call are the next segment's,
			// followed from its start.
			v.liveSeg, v.waitTool = j+1, ""
			pending := v.pending
			v.pending, v.pendLen = nil, 0
			for _, f := range pending {
				v.delta(f)
			}
		}
	}
}

// endLive ends the live parts still open.
func (v *turnView) endLive() {
	for i := range v.cur {
		if v.cur[i].open {
			v.sink.emit(viewEvent{Op: opPartEnd, Kind: v.cur[i].kind, ID: v.cur[i].id})
			v.cur[i].open = false
		}
	}
}

func (v *turnView) frame(ctx context.Context, raw []byte) {
	var f deltaFrame
	if json.Unmarshal(raw, &f) != nil || !v.ours(ctx, f.TurnID) {
		return
	}
	switch f.Type {
	case frameToolCall:
		if j, ok := v.toolSeg[f.ToolCallID]; ok {
			v.liveSeg, v.waitTool = j+1, ""
		} else {
			v.liveSeg, v.waitTool = -1, f.ToolCallID
			v.pending, v.pendLen = v.pending[:0], 0
		}
	case frameDelta:
		if f.Kind != kindText && f.Kind != kindReasoning {
			return
		}
		if v.liveSeg < 0 {
			if v.waitTool != "" && v.pendLen+len(f.Delta) <= maxPendingLive {
				v.pending = append(v.pending, f)
				v.pendLen += len(f.Delta)
			} else {
				v.waitTool = "" // the segment's text will come whole
			}
			return
		}
		v.delta(f)
	}
}

// delta applies a delta of the live segment.
func (v *turnView) delta(f deltaFrame) {
	if v.liveSeg != v.segs {
		return // a recorded segment's: the record covered it
	}
	if n := len(v.cur); n > 0 && v.cur[n-1].open && v.cur[n-1].kind == f.Kind {
		lp := &v.cur[n-1]
		lp.text += f.Delta
		v.sink.emit(viewEvent{Op: opPartDelta, Kind: lp.kind, ID: lp.id, Delta: f.Delta})
		return
	}
	v.endLive()
	lp := livePart{kind: f.Kind, id: partID(v.segs, len(v.cur)), text: f.Delta, open: true}
	v.cur = append(v.cur, lp)
	v.sink.emit(viewEvent{Op: opPartStart, Kind: lp.kind, ID: lp.id})
	v.sink.emit(viewEvent{Op: opPartDelta, Kind: lp.kind, ID: lp.id, Delta: f.Delta})
}
