// Package turnview derives one submission's answer from the two sources a
// stream serves: the log, from the submission's offset, and the live delta
// frames (wire.DeltaFrame) of the turn that answers it. The answer comes as
// a sequence of Events in no client's format; the client adapters of the
// HTTP server (AI SDK, AG-UI, A2A, in package transport) turn them into
// their client's wire format through a Sink. Nothing is kept besides what
// one view is writing.
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
//
// A View needs only small interfaces: a Log to read and wait on, and a
// Deltas cursor (nil for the log alone). It knows no HTTP framework and no
// broker.
package turnview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// Op is what an Event does.
type Op string

// Operations of an Event.
const (
	OpStart      Op = "start"       // the view begins: Sub is the submission
	OpPartStart  Op = "part-start"  // a text or reasoning part begins: Kind, ID
	OpPartDelta  Op = "part-delta"  // Kind, ID, Delta
	OpPartEnd    Op = "part-end"    // Kind, ID
	OpToolCall   Op = "tool-call"   // ID, ToolName, Input
	OpToolResult Op = "tool-result" // ID, ToolName, Output, IsError
	OpFinish     Op = "finish"      // Outcome, Failure (nil on success), Sub
	// OpInputRequired ends the view without a settlement: the turn stopped
	// to ask a person to approve tool calls (Requests), and the submission
	// waits, input_required. Its resumption is another turn.
	OpInputRequired Op = "input-required"
)

// Kinds of a part event.
const (
	KindText      = record.PartText
	KindReasoning = record.PartReasoning
)

// Event is one step of a submission's answer, in no client's format.
type Event struct {
	Op       Op
	Kind     string
	ID       string
	Delta    string
	ToolName string
	Input    json.RawMessage
	Output   json.RawMessage
	IsError  bool
	Outcome  record.Outcome
	Failure  *record.Failure
	Sub      record.Submission
	Requests []record.ApprovalRequest
}

// Sink is an adapter's encoder: Emit buffers an event, Flush sends what
// was buffered (and is where a write error surfaces), Keepalive keeps an
// idle connection proven alive.
type Sink interface {
	Emit(ev Event)
	Keepalive()
	Flush() error
}

// Log is what a view reads of the storage engine; *log.DB satisfies it.
type Log interface {
	Read(ctx context.Context, key record.Key, offset record.Offset, limit int) (record.ReadResult, error)
	Submission(ctx context.Context, id string) (record.Submission, error)
	// Changed is closed by the next commit that appends to or resets key.
	Changed(key record.Key) (ch <-chan struct{}, release func())
	// Done is closed when the log closes.
	Done() <-chan struct{}
}

var _ Log = (*log.DB)(nil)

// Deltas is one reader's cursor over a conversation's live delta frames
// (each the JSON of a wire.DeltaFrame). The HTTP server's DeltaCursor
// satisfies it.
type Deltas interface {
	// Ready is closed when frames past the cursor exist.
	Ready() <-chan struct{}
	// Next appends the frames past the cursor to dst, moves the cursor
	// past them and returns dst.
	Next(dst [][]byte) [][]byte
}

// Config is what every view of a server shares.
type Config struct {
	// Log is read from the submission's offset. Required.
	Log Log
	// Heartbeat is the period of Sink.Keepalive while a view waits; 0
	// sends none.
	Heartbeat time.Duration
	// PageLimit bounds the records of one read; 0 is log.DefaultReadLimit.
	PageLimit int
	// Stopping is closed when the server stops: Run then returns
	// ErrStopped. May be nil.
	Stopping <-chan struct{}
}

var (
	// ErrReset ends a view whose stream was reset under it.
	ErrReset = errors.New("the conversation was reset while its answer was being read")
	// ErrStopped ends a view because the server or the log is stopping;
	// the client resumes elsewhere.
	ErrStopped = errors.New("the server is shutting down")
)

// maxPendingLive bounds the live text a view holds for a segment whose
// predecessor is not recorded yet; past it the segment's text comes whole
// from its record.
const maxPendingLive = 1 << 20

type livePart struct {
	kind, id, text string
	open           bool
}

// View is the view of one submission's answer, for one reader.
type View struct {
	c      Config
	key    record.Key
	sub    record.Submission
	sink   Sink
	cursor Deltas // nil: the log only
	// snapshot stops at the log's tail instead of waiting for the end.
	snapshot bool

	turnID string
	others map[string]bool // turn ids known not to answer sub

	segs     int               // recorded segments of the turn processed
	toolSeg  map[string]int    // tool call id -> its recorded segment
	liveSeg  int               // the segment the deltas are in; -1 unknown
	waitTool string            // a tool call seen live, not yet recorded
	pending  []wire.DeltaFrame // deltas after waitTool
	pendLen  int
	cur      []livePart // live parts of segment segs
	done     bool
}

// New prepares the view of sub, in key, for sink. cursor follows key's
// deltas (nil: the log alone); fresh says that it followed them before the
// turn answering sub could have published any.
func New(c Config, key record.Key, sub record.Submission, cursor Deltas, fresh bool, sink Sink) *View {
	if c.PageLimit <= 0 {
		c.PageLimit = log.DefaultReadLimit
	}
	v := &View{c: c, key: key, sub: sub, sink: sink, cursor: cursor, turnID: sub.TurnID,
		others: map[string]bool{}, toolSeg: map[string]int{}, liveSeg: -1}
	if fresh {
		v.liveSeg = 0
	}
	return v
}

// Settled reports whether the view has seen the submission's settlement
// (and emitted OpFinish).
func (v *View) Settled() bool { return v.done }

// Snapshot emits the answer as the log holds it, up to its tail, and
// returns: what Run does without waiting.
func (v *View) Snapshot(ctx context.Context) error {
	v.snapshot = true
	return v.run(ctx)
}

// Run emits the answer until the submission settles. It returns nil when
// the answer ended or ctx ended (the client left), an error when the
// stream cannot go on (ErrReset, a read error) or a Flush failed.
// Shutdown (Config.Stopping, the log's Done) ends it early with
// ErrStopped.
func (v *View) Run(ctx context.Context) error { return v.run(ctx) }

func (v *View) run(ctx context.Context) error {
	v.sink.Emit(Event{Op: OpStart, Sub: v.sub})
	offset := v.sub.Offset
	var inc record.Incarnation
	var heartbeat <-chan time.Time
	if !v.snapshot && v.c.Heartbeat > 0 {
		t := time.NewTicker(v.c.Heartbeat)
		defer t.Stop()
		heartbeat = t.C
	}
	var frames [][]byte
	for {
		changed, release := v.c.Log.Changed(v.key)
		// Frames before the read: a record that precedes a frame causally
		// (a segment recorded before the next one's deltas) is then read
		// before that frame is applied.
		frames = frames[:0]
		if v.cursor != nil {
			frames = v.cursor.Next(frames)
		}
		for !v.done {
			page, err := v.c.Log.Read(ctx, v.key, offset, v.c.PageLimit)
			if err != nil {
				release()
				if errors.Is(err, log.ErrUnknownOffset) {
					return ErrReset
				}
				return err
			}
			if page.Incarnation != "" {
				if inc != "" && inc != page.Incarnation {
					release()
					return ErrReset
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
		if err := v.sink.Flush(); err != nil || v.done || v.snapshot {
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
				v.sink.Keepalive()
				if err := v.sink.Flush(); err != nil {
					release()
					return err
				}
				continue wait
			case <-ctx.Done():
				release()
				return nil
			case <-v.c.Log.Done():
				release()
				return ErrStopped
			case <-v.c.Stopping:
				release()
				return ErrStopped
			}
			break
		}
		release()
	}
}

// ours reports whether turn id answers the view's submission, learning the
// submission's turn from the log when it is not known yet.
func (v *View) ours(ctx context.Context, id string) bool {
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
	if sub, err := v.c.Log.Submission(ctx, v.sub.ID); err == nil && sub.TurnID != "" {
		v.turnID = sub.TurnID
		return id == v.turnID
	}
	v.others[id] = true
	return false
}

func (v *View) record(ctx context.Context, r record.Record) error {
	if r.Kind != record.KindEntry || r.Entry == nil {
		return nil
	}
	e := r.Entry
	switch e.Type {
	case record.EntrySettlement:
		var st record.Settlement
		if json.Unmarshal(e.Payload, &st) != nil || st.SubmissionID != v.sub.ID {
			return nil
		}
		v.endLive()
		v.sink.Emit(Event{Op: OpFinish, Outcome: st.Outcome, Failure: st.Error, Sub: v.sub})
		v.done = true
	case record.EntryApprovalRequest:
		if e.SubmissionID != v.sub.ID {
			return nil
		}
		// Only the request the submission waits on now ends the view: an
		// earlier one, decided since, is history of a resumed submission.
		sub, err := v.c.Log.Submission(ctx, v.sub.ID)
		if err != nil || !sub.Waiting() || sub.TurnID != e.TurnID {
			return nil
		}
		var p record.ApprovalRequestPayload
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			return fmt.Errorf("approval request %s: %w", e.ID, err)
		}
		v.endLive()
		v.sink.Emit(Event{Op: OpInputRequired, Requests: p.Requests, Sub: sub})
		v.done = true
	case record.EntryAssistantMessage:
		if e.SubmissionID == v.sub.ID && v.turnID == "" && e.TurnID != "" {
			v.turnID = e.TurnID
		}
		if !v.ours(ctx, e.TurnID) {
			return nil
		}
		var m record.MessagePayload
		if err := json.Unmarshal(e.Payload, &m); err != nil {
			return fmt.Errorf("assistant message %s: %w", e.ID, err)
		}
		v.segment(m.Parts)
	case record.EntryToolResult:
		if !v.ours(ctx, e.TurnID) {
			return nil
		}
		var tr record.ToolResultPayload
		if err := json.Unmarshal(e.Payload, &tr); err != nil {
			return fmt.Errorf("tool result %s: %w", e.ID, err)
		}
		v.sink.Emit(Event{Op: OpToolResult, ID: tr.ToolCallID, ToolName: tr.ToolName, Output: tr.Output, IsError: tr.IsError})
	}
	return nil
}

// partID names part i of segment seg: the same on every replay, so a
// resumed client sees the ids it saw live.
func partID(seg, i int) string { return "p" + strconv.Itoa(seg) + "." + strconv.Itoa(i) }

// segment emits a recorded segment, completing what its live deltas left
// out, and makes the next segment the live one.
func (v *View) segment(parts []record.Part) {
	k := v.segs
	for i, p := range parts {
		switch p.Type {
		case record.PartText, record.PartReasoning:
			if i < len(v.cur) && v.cur[i].kind == p.Type && strings.HasPrefix(p.Text, v.cur[i].text) {
				lp := &v.cur[i]
				if !lp.open {
					// Ended live at a kind switch; what lost frames
					// dropped from it cannot be added after its end.
					continue
				}
				if rest := p.Text[len(lp.text):]; rest != "" {
					v.sink.Emit(Event{Op: OpPartDelta, Kind: lp.kind, ID: lp.id, Delta: rest})
				}
				v.sink.Emit(Event{Op: OpPartEnd, Kind: lp.kind, ID: lp.id})
				lp.open = false
				continue
			}
			v.endLive()
			id := partID(k, i)
			v.sink.Emit(Event{Op: OpPartStart, Kind: p.Type, ID: id})
			if p.Text != "" {
				v.sink.Emit(Event{Op: OpPartDelta, Kind: p.Type, ID: id, Delta: p.Text})
			}
			v.sink.Emit(Event{Op: OpPartEnd, Kind: p.Type, ID: id})
		case record.PartToolCall:
			v.endLive()
			v.toolSeg[p.ToolCallID] = k
			v.sink.Emit(Event{Op: OpToolCall, ID: p.ToolCallID, ToolName: p.ToolName, Input: p.Input})
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
func (v *View) endLive() {
	for i := range v.cur {
		if v.cur[i].open {
			v.sink.Emit(Event{Op: OpPartEnd, Kind: v.cur[i].kind, ID: v.cur[i].id})
			v.cur[i].open = false
		}
	}
}

func (v *View) frame(ctx context.Context, raw []byte) {
	var f wire.DeltaFrame
	if json.Unmarshal(raw, &f) != nil || !v.ours(ctx, f.TurnID) {
		return
	}
	switch f.Type {
	case wire.FrameToolCallDelta:
		if j, ok := v.toolSeg[f.ToolCallID]; ok {
			v.liveSeg, v.waitTool = j+1, ""
		} else {
			v.liveSeg, v.waitTool = -1, f.ToolCallID
			v.pending, v.pendLen = v.pending[:0], 0
		}
	case wire.FrameDelta:
		if f.Kind != KindText && f.Kind != KindReasoning {
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
func (v *View) delta(f wire.DeltaFrame) {
	if v.liveSeg != v.segs {
		return // a recorded segment's: the record covered it
	}
	if n := len(v.cur); n > 0 && v.cur[n-1].open && v.cur[n-1].kind == f.Kind {
		lp := &v.cur[n-1]
		lp.text += f.Delta
		v.sink.Emit(Event{Op: OpPartDelta, Kind: lp.kind, ID: lp.id, Delta: f.Delta})
		return
	}
	v.endLive()
	lp := livePart{kind: f.Kind, id: partID(v.segs, len(v.cur)), text: f.Delta, open: true}
	v.cur = append(v.cur, lp)
	v.sink.Emit(Event{Op: OpPartStart, Kind: lp.kind, ID: lp.id})
	v.sink.Emit(Event{Op: OpPartDelta, Kind: lp.kind, ID: lp.id, Delta: f.Delta})
}
