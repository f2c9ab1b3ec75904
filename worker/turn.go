package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/oklog/ulid/v2"

	clog "github.com/convlog/convlog/log"
)

// maxTurnSubmissions bounds how many queued submissions one turn answers:
// its settlement batch (one entry each, plus its message) must fit in one
// log batch, and a prompt of thousands of messages helps no agent. The
// rest wait for the next turn.
const maxTurnSubmissions = 256

// nextTurn starts a turn for every admitted submission of the session, runs
// it and settles it. ran is false when there was nothing to run.
func (p *Pool) nextTurn(key clog.Key, held **lease, claimed *clog.Submission) (ran bool, err error) {
	lk := p.stripe(key)
	lk.Lock()
	var t *turn
	var ids []string
	if claimed != nil {
		// Admitted already running, in the admission's own commit, for
		// this runner: no second commit before the agent is called. Under
		// the stripe, an abort either settled it before (skip) or will
		// find its turn registered below (cancel).
		sub, err := p.cfg.Log.Submission(p.turnsCtx, claimed.ID)
		if err == nil && *held != nil && sub.Status == clog.StatusRunning && sub.TurnID == claimed.TurnID {
			inc, _, err := p.cfg.Log.Tail(p.turnsCtx, key)
			if err != nil {
				lk.Unlock()
				return false, err
			}
			t = &turn{p: p, key: key, id: sub.TurnID, subs: []clog.Submission{sub}, inc: inc}
			ids = []string{sub.ID}
		}
		// Otherwise (aborted meanwhile, or reset): on to what is pending.
	}
	if t == nil {
		pending, err := p.cfg.Log.Pending(p.turnsCtx, key)
		if err != nil {
			lk.Unlock()
			return false, err
		}
		var subs []clog.Submission
		for _, s := range pending {
			if s.Status == clog.StatusAdmitted && len(subs) < maxTurnSubmissions {
				subs = append(subs, s)
			}
		}
		if len(subs) == 0 {
			lk.Unlock()
			return false, nil
		}
		// One turn at a time per session, across every worker on the
		// broker. The runner keeps the lease across consecutive turns.
		if *held == nil {
			ls, err := p.leases.acquire(p.turnsCtx, key)
			if errors.Is(err, ErrLeaseHeld) {
				// Its holder re-reads the session's pending submissions
				// after its turn, so ours are not forgotten.
				lk.Unlock()
				return false, nil
			}
			if err != nil {
				lk.Unlock()
				return false, err
			}
			*held = ls
		}
		t = &turn{p: p, key: key, id: "turn_" + ulid.Make().String(), subs: subs}
		ids = make([]string, len(subs))
		for i, s := range subs {
			ids[i] = s.ID
		}
		// The delivery position is recorded before the call: once
		// running, a submission is never delivered again, whatever
		// happens to us.
		started, err := p.cfg.Log.Write(p.turnsCtx, clog.Write{Key: key, Start: ids, TurnID: t.id})
		if err != nil {
			lk.Unlock()
			return false, fmt.Errorf("start turn: %w", err)
		}
		t.inc = started.Incarnation
	}
	ls := *held
	ctx, cancel := context.WithCancelCause(p.turnsCtx)
	kept := make(chan struct{})
	lost := false
	go func() {
		defer close(kept)
		ls.keep(ctx, func(err error) {
			p.logger.Error("worker: lost the session lease; stopping the turn", "session", key.String(), "err", err)
			lost = true
			cancel(errLeaseLost)
		})
	}()
	ts := &turnState{id: t.id, cancel: cancel, done: make(chan struct{})}
	p.mu.Lock()
	for _, id := range ids {
		p.running[id] = ts
	}
	p.mu.Unlock()
	lk.Unlock()

	defer func() {
		p.mu.Lock()
		for _, id := range ids {
			delete(p.running, id)
		}
		p.mu.Unlock()
		cancel(nil)
		<-kept // the renewals are done with ls before the next turn uses it
		if lost {
			*held = nil
		}
		close(ts.done)
	}()
	return true, t.run(ctx)
}

// turn is one invocation of an agent, answering one or more submissions.
// The first is the turn's own; the others are answered by it.
type turn struct {
	p    *Pool
	key  clog.Key
	id   string
	subs []clog.Submission

	inc       clog.Incarnation  // the stream's, when the turn started
	parts     []clog.Part       // the assistant message being streamed
	toolNames map[string]string // tool call id -> name, for its result
}

func (t *turn) primary() string { return t.subs[0].ID }

// outcome is how the turn ends.
type outcome struct {
	outcome clog.Outcome
	failure *clog.Failure
	data    json.RawMessage
	reset   bool // the stream was reset under the turn: nothing to settle
}

func (t *turn) run(ctx context.Context) error {
	var res outcome
	agent, ok := t.p.cfg.Agents.lookup(t.key.Agent)
	prompt, perr := t.prompt(ctx)
	switch {
	case !ok:
		res = failed("unknown_agent", "no agent named "+t.key.Agent+" is served", false)
	case perr != nil:
		res = failed("prompt_unreadable", perr.Error(), true)
	default:
		res = t.consume(ctx, agent, prompt)
	}
	return t.settle(ctx, res)
}

// storageFailure is the outcome of a turn whose records cannot be written.
// A reset stream is not a failure of the turn: the reset settled its
// submissions, and the turn just stops.
func storageFailure(err error) outcome {
	if errors.Is(err, clog.ErrIncarnationChanged) {
		return outcome{reset: true}
	}
	return failed("storage", err.Error(), true)
}

func failed(code, msg string, retryable bool) outcome {
	return outcome{outcome: clog.OutcomeFailed, failure: &clog.Failure{Code: code, Message: msg, Retryable: retryable}}
}

// consume runs the agent and records what it does: deltas to the bus as
// they come, the assistant message and each tool call durably as each
// completes, so a crash mid-turn keeps what was done.
func (t *turn) consume(ctx context.Context, agent Agent, prompt Prompt) (res outcome) {
	defer func() {
		if r := recover(); r != nil {
			t.p.logger.Error("worker: agent panicked", "agent", t.key.Agent, "panic", r)
			res = failed("agent_panic", fmt.Sprint("agent panicked: ", r), false)
		}
	}()
	scope := Scope{Session: t.key.String(), Agent: t.key.Agent, Instance: t.key.Instance}
	for ev := range agent.Invoke(ctx, scope, prompt) {
		if ctx.Err() != nil {
			break
		}
		switch ev.Type {
		case EventText, EventThinking:
			kind, part := "text", clog.PartText
			if ev.Type == EventThinking {
				kind, part = "reasoning", clog.PartReasoning
			}
			t.appendText(part, ev.Delta)
			t.publish(Frame{Type: FrameDelta, Kind: kind, Delta: ev.Delta})
		case EventToolStarted:
			args := ev.Args
			if len(args) == 0 || !json.Valid(args) {
				args = json.RawMessage("null")
			}
			t.parts = append(t.parts, clog.Part{Type: clog.PartToolCall, ToolCallID: ev.ID, ToolName: ev.Name, Input: args})
			if t.toolNames == nil {
				t.toolNames = map[string]string{}
			}
			t.toolNames[ev.ID] = ev.Name
			t.publish(Frame{Type: FrameToolCallDelta, ToolCallID: ev.ID, ToolName: ev.Name, Args: args})
			if err := t.flushMessage(ctx); err != nil {
				return storageFailure(err)
			}
		case EventToolEnded:
			content := ev.Content
			if len(content) == 0 || !json.Valid(content) {
				content = json.RawMessage("null")
			}
			payload, _ := json.Marshal(clog.ToolResultPayload{ToolCallID: ev.ID, ToolName: t.toolNames[ev.ID], IsError: ev.IsError, Output: content})
			if err := t.append(ctx, clog.EntryRecord(clog.Entry{Type: clog.EntryToolResult, Payload: payload})); err != nil {
				return storageFailure(err)
			}
		case EventRetrying:
			t.publish(Frame{Type: FrameRetrying, Attempt: ev.Attempt, MaxAttempts: ev.MaxAttempts, DelayMs: ev.DelayMs, Reason: ev.Reason})
		case EventCompleted:
			return outcome{outcome: clog.OutcomeCompleted, data: ev.Data}
		case EventFailed:
			code := ev.Code
			if code == "" {
				code = "agent_failed"
			}
			return outcome{outcome: clog.OutcomeFailed, failure: &clog.Failure{Code: code, Message: ev.Details, Retryable: ev.Retryable}}
		}
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errAborted):
		return outcome{outcome: clog.OutcomeAborted, failure: &clog.Failure{Code: "aborted", Message: "aborted while running"}}
	case errors.Is(cause, errLeaseLost):
		return failed("lease_lost", "the worker lost its session lease (broker unreachable); the turn was stopped so that no other turn runs beside it", true)
	case ctx.Err() != nil:
		f := interruptedFailure
		return outcome{outcome: clog.OutcomeFailed, failure: &f}
	}
	return failed("agent_protocol", "the agent's event stream ended without a completed or failed event", true)
}

func (t *turn) appendText(typ, delta string) {
	if n := len(t.parts); n > 0 && t.parts[n-1].Type == typ {
		t.parts[n-1].Text += delta
		return
	}
	t.parts = append(t.parts, clog.Part{Type: typ, Text: delta})
}

func (t *turn) publish(f Frame) {
	if t.p.cfg.Deltas == nil {
		return
	}
	f.TurnID, f.SubmissionID = t.id, t.primary()
	if err := t.p.cfg.Deltas.Publish(t.key, f); err != nil {
		t.p.logger.Debug("worker: publish delta", "err", err)
	}
}

// assistantRecord takes the message streamed so far, if any.
func (t *turn) assistantRecord(data json.RawMessage) []clog.Record {
	if len(data) > 0 && json.Valid(data) {
		t.parts = append(t.parts, clog.Part{Type: clog.PartData, Name: "result", Data: data})
	}
	if len(t.parts) == 0 {
		return nil
	}
	payload, _ := json.Marshal(clog.MessagePayload{Parts: t.parts})
	t.parts = nil
	return []clog.Record{clog.EntryRecord(clog.Entry{Type: clog.EntryAssistantMessage, Payload: payload})}
}

func (t *turn) flushMessage(ctx context.Context) error {
	recs := t.assistantRecord(nil)
	if len(recs) == 0 {
		return nil
	}
	return t.append(ctx, recs...)
}

func (t *turn) append(ctx context.Context, recs ...clog.Record) error {
	for i := range recs {
		if recs[i].Entry != nil {
			recs[i].Entry.SubmissionID, recs[i].Entry.TurnID = t.primary(), t.id
		}
	}
	// Not ctx: what the agent did must be recorded even as we are aborted.
	_, err := t.p.cfg.Log.Write(context.WithoutCancel(ctx), clog.Write{Key: t.key, Records: recs, TurnID: t.id, Incarnation: t.inc})
	return err
}

// settle appends the rest of the message and one settlement per submission
// in one write: the records and the statuses agree whatever happens next.
func (t *turn) settle(ctx context.Context, res outcome) error {
	if res.reset {
		t.p.logger.Info("worker: the stream was reset under a running turn; it stopped", "session", t.key.String(), "turn", t.id)
		return nil
	}
	recs := t.assistantRecord(res.data)
	for i := range recs {
		recs[i].Entry.SubmissionID, recs[i].Entry.TurnID = t.primary(), t.id
	}
	w := clog.Write{Key: t.key, Records: recs, TurnID: t.id, Incarnation: t.inc}
	for _, s := range t.subs {
		st := clog.Settlement{SubmissionID: s.ID, Outcome: res.outcome, Error: res.failure}
		if s.ID != t.primary() {
			st.AnsweredBySubmissionID = t.primary()
		}
		w.Settle = append(w.Settle, st)
	}
	if _, err := t.p.cfg.Log.Write(context.WithoutCancel(ctx), w); err != nil {
		if errors.Is(err, clog.ErrIncarnationChanged) {
			return nil // reset at the last moment: the reset settled them
		}
		return fmt.Errorf("settle turn %s: %w", t.id, err)
	}
	return nil
}

// prompt gathers the text and images of the submissions' user entries.
func (t *turn) prompt(ctx context.Context) (Prompt, error) {
	var texts []string
	var pr Prompt
	for _, s := range t.subs {
		res, err := t.p.cfg.Log.Read(ctx, t.key, s.Offset, 1)
		if err != nil {
			return Prompt{}, fmt.Errorf("read submission %s: %w", s.ID, err)
		}
		if len(res.Batches) == 0 {
			return Prompt{}, fmt.Errorf("submission %s: no records at its offset", s.ID)
		}
		recs, err := res.Batches[0].Records.Decode()
		if err != nil {
			return Prompt{}, err
		}
		for _, r := range recs {
			if r.Kind != clog.KindEntry || r.Entry.ID != s.EntryID {
				continue
			}
			var msg clog.MessagePayload
			if err := json.Unmarshal(r.Entry.Payload, &msg); err != nil {
				return Prompt{}, fmt.Errorf("submission %s: payload: %w", s.ID, err)
			}
			var b strings.Builder
			for _, part := range msg.Parts {
				switch part.Type {
				case clog.PartText:
					b.WriteString(part.Text)
				case clog.PartFile:
					if img, ok := dataURLImage(part); ok {
						pr.Images = append(pr.Images, img)
					}
				}
			}
			texts = append(texts, b.String())
		}
	}
	pr.Text = strings.Join(texts, "\n\n")
	return pr, nil
}

// dataURLImage takes an inline image part (a data: URL) as a prompt image.
func dataURLImage(p clog.Part) (Image, bool) {
	rest, ok := strings.CutPrefix(p.URL, "data:")
	if !ok {
		return Image{}, false
	}
	meta, data, ok := strings.Cut(rest, ",")
	mime, isBase64 := strings.CutSuffix(meta, ";base64")
	if !ok || !isBase64 || !strings.HasPrefix(mime, "image/") {
		return Image{}, false
	}
	return Image{MimeType: mime, Data: data}, true
}
