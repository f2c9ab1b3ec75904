package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/natsbus"
)

// maxTurnSubmissions bounds how many queued submissions one turn answers:
// its settlement batch (one entry each, plus its message) must fit in one
// log batch, and a prompt of thousands of messages helps no agent. The
// rest wait for the next turn.
const maxTurnSubmissions = 256

// heldLease is the session lease a runner keeps across consecutive turns.
// Release is idempotent.
type heldLease struct {
	lease *natsbus.Lease
}

func (h *heldLease) held() bool { return h.lease != nil }

// release gives the lease back (it lapses by itself if that fails).
func (h *heldLease) release(p *Pool, key record.Key) {
	if h.lease == nil {
		return
	}
	if err := h.lease.Release(context.WithoutCancel(p.turnsCtx)); err != nil {
		p.logger.Warn("worker: release lease (it will lapse)", "session", key.String(), "err", err)
	}
	h.lease = nil
}

// nextTurn starts a turn for every admitted submission of the session, runs
// it and settles it. ran is false when there was nothing to run.
func (p *Pool) nextTurn(key record.Key, held *heldLease, claimed *record.Submission) (ran bool, err error) {
	t, ts, ctx, err := p.beginTurn(key, held, claimed)
	if err != nil || t == nil {
		return false, err
	}
	ls := held.lease
	kept := make(chan struct{})
	lost := false // written by Keep's callback, read after kept closes
	go func() {
		defer close(kept)
		ls.Keep(ctx, func(err error) {
			p.logger.Error("worker: lost the session lease; stopping the turn", "session", key.String(), "err", err)
			lost = true
			if p.cfg.Observer != nil {
				p.cfg.Observer.LeaseLost()
			}
			ts.cancel(errLeaseLost)
		})
	}()
	defer func() {
		p.unregister(ts)
		ts.cancel(nil)
		<-kept // the renewals are done with ls before the next turn uses it
		if lost {
			held.lease = nil
		}
		close(ts.done)
	}()
	return true, t.run(ctx)
}

// beginTurn, under the session's stripe, picks what the next turn answers
// (the claimed admission, or the pending submissions), records their start
// and registers the turn for aborts before the stripe is released: an
// abort either settles a submission before the turn takes it, or finds
// the turn to cancel. A nil turn means there is nothing to run.
func (p *Pool) beginTurn(key record.Key, held *heldLease, claimed *record.Submission) (*turn, *turnState, context.Context, error) {
	lk := p.stripe(key)
	lk.Lock()
	defer lk.Unlock()
	var t *turn
	if claimed != nil && held.held() {
		var err error
		if t, err = p.claimedTurn(key, claimed); err != nil {
			return nil, nil, nil, err
		}
	}
	if t == nil {
		var err error
		if t, err = p.pendingTurn(key, held); err != nil || t == nil {
			return nil, nil, nil, err
		}
	}
	t.lease = held.lease
	ctx, cancel := context.WithCancelCause(p.turnsCtx)
	ts := &turnState{id: t.id, key: key, cancel: cancel, done: make(chan struct{})}
	for _, s := range t.subs {
		ts.ids = append(ts.ids, s.ID)
	}
	p.register(ts)
	return t, ts, ctx, nil
}

// claimedTurn is the turn of a submission admitted already running, in
// the admission's own commit, for this runner: no second commit before the
// agent is called. Nil if it was aborted meanwhile, or the stream reset.
func (p *Pool) claimedTurn(key record.Key, claimed *record.Submission) (*turn, error) {
	sub, err := p.cfg.Log.Submission(p.turnsCtx, claimed.ID)
	if err != nil || sub.Status != record.StatusRunning || sub.TurnID != claimed.TurnID {
		return nil, nil // on to what is pending
	}
	inc, _, err := p.cfg.Log.Tail(p.turnsCtx, key)
	if err != nil {
		return nil, err
	}
	t := &turn{p: p, key: key, id: sub.TurnID, subs: []record.Submission{sub}, inc: inc}
	p.readPrompt(t)
	return t, nil
}

// pendingTurn starts a turn for the session's admitted submissions (one
// under the queue and interrupt policies, and for an agent with
// approvals), taking the session's lease if the runner does not hold it
// yet. In admission order: a submission waiting for a person's approval
// blocks everything after it; one whose approvals are all decided is
// resumed alone (Prompt.Resume). Nil when there is nothing to run or
// another worker holds the lease.
func (p *Pool) pendingTurn(key record.Key, held *heldLease) (*turn, error) {
	// Bounded: a backlog of any size costs a turn only what it takes (and
	// must fit in one reply when the log is remote). Running submissions,
	// at most a turn's, come before the admitted ones they were admitted
	// before; any beyond the window are found by the next turn's look.
	pending, err := p.cfg.Log.PendingFirst(p.turnsCtx, key, 2*maxTurnSubmissions)
	if err != nil {
		return nil, err
	}
	limit := maxTurnSubmissions
	if opts, _ := p.cfg.Agents.Options(key.Agent); opts.Busy.OneAtATime() || opts.Approvals {
		// queue, interrupt: a turn per submission; and an agent that may
		// ask a person waits with one submission only.
		limit = 1
	}
	var subs []record.Submission
walk:
	for _, s := range pending {
		switch {
		case s.Waiting():
			// The session waits for a person: nothing admitted after it
			// runs before it is decided, resumed and settled.
			break walk
		case s.Resumable():
			// Decided: it resumes, alone, before what came after it.
			if len(subs) == 0 {
				subs = append(subs, s)
			}
			break walk
		case s.Status == record.StatusInputRequired:
			// Neither waiting nor resumable (no requests): nothing to run.
			break walk
		case s.Status == record.StatusAdmitted && len(subs) < limit:
			subs = append(subs, s)
		}
	}
	if len(subs) == 0 {
		return nil, nil
	}
	// One turn at a time per session, across every worker on the broker.
	if !held.held() {
		ls, err := p.leases.Acquire(p.turnsCtx, key)
		if errors.Is(err, natsbus.ErrLeaseHeld) {
			// Its holder re-reads the session's pending submissions after
			// its turn, so ours are not forgotten.
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		held.lease = ls
	}
	// A submission still running under the lease we now hold is a dead
	// holder's (with workers in several processes, the sweep may not have
	// come by yet): it is settled interrupted before the next turn starts,
	// so that turns follow one another in the log.
	if err := p.settleHeldOrphans(p.turnsCtx, key, held.lease, pending); err != nil {
		return nil, err
	}
	t := &turn{p: p, key: key, id: "turn_" + ulid.Make().String(), lease: held.lease}
	// Read before the turn has a context, which an abort cancels: an abort
	// settles the turn aborted, never unreadable.
	p.gatherTurn(t, subs)
	if len(t.subs) == 1 {
		t.resume()
	}
	ids := make([]string, len(t.subs))
	for i, s := range t.subs {
		ids[i] = s.ID
	}
	// The delivery position is recorded before the call: once running, a
	// submission is never delivered again, whatever happens to us.
	started, err := t.write(p.turnsCtx, clog.Write{Key: key, Start: ids, TurnID: t.id})
	if errors.Is(err, clog.ErrSubmissionNotFound) {
		// Purged since they were read: nothing left to run.
		p.logger.Debug("worker: the conversation was purged before its turn started", "session", key.String(), "turn", t.id)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("start turn: %w", err)
	}
	t.inc = started.Incarnation
	return t, nil
}

// register makes a running turn findable by its submissions' ids (aborts).
func (p *Pool) register(ts *turnState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ts.ids {
		p.running[id] = ts
	}
}

func (p *Pool) unregister(ts *turnState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ts.ids {
		delete(p.running, id)
	}
}

// turn is one invocation of an agent, answering one or more submissions.
// The first is the turn's own; the others are answered by it.
type turn struct {
	p    *Pool
	key  record.Key
	id   string
	subs []record.Submission

	prompt    worker.Prompt
	promptErr error // the prompt of subs[0] could not be read

	inc   record.Incarnation // the stream's, when the turn started
	parts []record.Part      // the assistant message being streamed
	// text is the last text or reasoning part while it grows (textType,
	// not yet in parts): a Builder grows in amortized linear time, where
	// appending to the part's string copied it whole on every delta.
	text       strings.Builder
	textType   string
	partBytes  int                        // the text and inputs in parts
	toolNames  map[string]string          // tool call id -> name, for its result
	toolInputs map[string]json.RawMessage // tool call id -> its input
	principal  *worker.Principal          // who delivered the turn's own submission

	lease *natsbus.Lease // the session's, held by the runner
	step  uint64         // writes of the turn so far (its Fence steps)

	deltas *deltaQueue // its presentation frames, while it runs

	// requests are the tool calls the agent asked a person to approve,
	// in order: the turn then ends waiting (Write.Await), not settled.
	requests []record.ApprovalRequest
	results  map[string]bool // tool call ids with a result in this turn
}

func (t *turn) primary() string { return t.subs[0].ID }

// outcome is how the turn ends.
type outcome struct {
	outcome record.Outcome
	failure *record.Failure
	data    json.RawMessage
	reset   bool // the stream was reset under the turn: nothing to settle
	await   bool // completed asking for approvals: the submission waits
}

func (t *turn) run(ctx context.Context) error {
	began := time.Now()
	if bus := t.p.cfg.Deltas; bus != nil {
		t.deltas = newDeltaQueue(func(f wire.DeltaFrame) {
			if err := bus.Publish(t.key, f); err != nil {
				t.p.logger.Debug("worker: publish delta", "err", err)
			}
		})
		defer t.deltas.close()
	}
	var res outcome
	if obs := t.p.cfg.Observer; obs != nil {
		defer func() {
			if !res.reset && !res.await {
				obs.TurnEnded(t.key.Agent, res.outcome, time.Since(began))
			}
		}()
	}
	agent, ok := t.p.cfg.Agents.lookup(t.key.Agent)
	if opts, _ := t.p.cfg.Agents.Options(t.key.Agent); opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, opts.Timeout, errDeadline)
		defer cancel()
	}
	switch {
	case !ok:
		res = failed("unknown_agent", "no agent named "+t.key.Agent+" is served", false)
	case t.promptErr != nil:
		res = failed("prompt_unreadable", t.promptErr.Error(), true)
	default:
		res = t.consume(ctx, agent, t.prompt)
	}
	return t.settle(ctx, res)
}

// storageFailure is the outcome of a turn whose records cannot be written.
// A reset stream is not a failure of the turn: the reset settled its
// submissions, and the turn just stops.
func storageFailure(err error) outcome {
	switch {
	case errors.Is(err, clog.ErrIncarnationChanged):
		return outcome{reset: true}
	case errors.Is(err, clog.ErrBatchTooLarge):
		return replyTooLarge(err)
	}
	return failed("storage", err.Error(), true)
}

// replyTooLarge is the outcome of a turn whose reply has a record the log
// cannot hold in one batch (a tool call input or a result datum over its
// limit): retrying the same request would fail the same way.
func replyTooLarge(err error) outcome {
	return failed("reply_too_large", "the agent's reply could not be stored: "+err.Error(), false)
}

func failed(code, msg string, retryable bool) outcome {
	return outcome{outcome: record.OutcomeFailed, failure: &record.Failure{Code: code, Message: msg, Retryable: retryable}}
}

// consume runs the agent and records what it does: deltas to the bus as
// they come, the assistant message and each tool call durably as each
// completes, so a crash mid-turn keeps what was done.
func (t *turn) consume(ctx context.Context, agent worker.Agent, prompt worker.Prompt) (res outcome) {
	defer func() {
		if r := recover(); r != nil {
			t.p.logger.Error("worker: agent panicked", "agent", t.key.Agent, "panic", r)
			res = failed("agent_panic", fmt.Sprint("agent panicked: ", r), false)
		}
	}()
	scope := worker.Scope{Session: t.key.String(), Agent: t.key.Agent, Instance: t.key.Instance, TurnID: t.id, Principal: t.principal}
	for ev := range agent.Invoke(ctx, scope, prompt) {
		if ctx.Err() != nil {
			break
		}
		switch ev.Type {
		case worker.EventText, worker.EventThinking:
			kind, part := "text", record.PartText
			if ev.Type == worker.EventThinking {
				kind, part = "reasoning", record.PartReasoning
			}
			t.publish(wire.DeltaFrame{Type: wire.FrameDelta, Kind: kind, Delta: ev.Delta})
			if err := t.addText(ctx, part, ev.Delta); err != nil {
				return storageFailure(err)
			}
		case worker.EventToolStarted:
			args := ev.Args
			if len(args) == 0 || !json.Valid(args) {
				args = json.RawMessage("null")
			}
			t.endText()
			t.parts = append(t.parts, record.Part{Type: record.PartToolCall, ToolCallID: ev.ID, ToolName: ev.Name, Input: args})
			t.partBytes += len(args)
			if t.toolNames == nil {
				t.toolNames = map[string]string{}
			}
			t.toolNames[ev.ID] = ev.Name
			if t.toolInputs == nil {
				t.toolInputs = map[string]json.RawMessage{}
			}
			t.toolInputs[ev.ID] = args
			t.publish(wire.DeltaFrame{Type: wire.FrameToolCallDelta, ToolCallID: ev.ID, ToolName: ev.Name, Args: args})
			if err := t.flushMessage(ctx); err != nil {
				return storageFailure(err)
			}
		case worker.EventToolEnded:
			content := ev.Content
			if len(content) == 0 || !json.Valid(content) {
				content = json.RawMessage("null")
			}
			payload, _ := json.Marshal(record.ToolResultPayload{ToolCallID: ev.ID, ToolName: t.toolNames[ev.ID], IsError: ev.IsError, Output: content})
			if err := t.append(ctx, record.EntryRecord(record.Entry{Type: record.EntryToolResult, Payload: payload})); err != nil {
				return storageFailure(err)
			}
			if t.results == nil {
				t.results = map[string]bool{}
			}
			t.results[ev.ID] = true
		case worker.EventApprovalRequested:
			if res, ok := t.request(ev); !ok {
				return res
			}
		case worker.EventToolInputDelta:
			t.publish(wire.DeltaFrame{Type: wire.FrameToolCallDelta, ToolCallID: ev.ID, ToolName: ev.Name, ArgsDelta: ev.Delta})
		case worker.EventRetrying:
			t.publish(wire.DeltaFrame{Type: wire.FrameRetrying, Attempt: ev.Attempt, MaxAttempts: ev.MaxAttempts, DelayMs: ev.DelayMs, Reason: ev.Reason})
		case worker.EventCompleted:
			if len(t.requests) > 0 {
				return outcome{outcome: record.OutcomeCompleted, data: ev.Data, await: true}
			}
			return outcome{outcome: record.OutcomeCompleted, data: ev.Data}
		case worker.EventFailed:
			code := ev.Code
			if code == "" {
				code = "agent_failed"
			}
			return outcome{outcome: record.OutcomeFailed, failure: &record.Failure{Code: code, Message: ev.Details, Retryable: ev.Retryable}}
		default:
			// Not ours to interpret, but not ours to drop either: live
			// readers get it unchanged (the contract's relay MUST 5).
			raw := ev.Raw
			if len(raw) == 0 || !json.Valid(raw) {
				raw, _ = json.Marshal(ev)
			}
			t.publish(wire.DeltaFrame{Type: wire.FrameEvent, Event: raw})
		}
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errAborted):
		return outcome{outcome: record.OutcomeAborted, failure: &record.Failure{Code: "aborted", Message: "aborted while running"}}
	case errors.Is(cause, errDeadline):
		return failed("deadline_exceeded", "the turn ran longer than its agent's timeout", true)
	case errors.Is(cause, errLeaseLost):
		return failed("lease_lost", "the worker lost its session lease (broker unreachable); the turn was stopped so that no other turn runs beside it", true)
	case ctx.Err() != nil:
		f := interruptedFailure
		return outcome{outcome: record.OutcomeFailed, failure: &f}
	}
	return failed("agent_protocol", "the agent's event stream ended without a completed or failed event", true)
}

// request takes an approval_requested event: ev.ID must be a tool call
// this turn started, without a result, not requested already; and the turn
// must answer one submission, the one that waits.
func (t *turn) request(ev worker.Event) (outcome, bool) {
	name, started := t.toolNames[ev.ID]
	switch {
	case !started || ev.ID == "":
		return failed("agent_protocol", fmt.Sprintf("the agent asked to approve tool call %q, which it did not start in this turn", record.Clip(ev.ID, 40)), false), false
	case t.results[ev.ID]:
		return failed("agent_protocol", fmt.Sprintf("the agent asked to approve tool call %q, which already has a result", record.Clip(ev.ID, 40)), false), false
	case len(t.subs) > 1:
		return failed("approval_joined", fmt.Sprintf("the agent asked for an approval in a turn answering %d submissions (busy policy join); only a turn answering one submission can wait for a person", len(t.subs)), false), false
	}
	for _, r := range t.requests {
		if r.ToolCallID == ev.ID {
			return failed("agent_protocol", fmt.Sprintf("the agent asked twice to approve tool call %q", record.Clip(ev.ID, 40)), false), false
		}
	}
	input := ev.Args
	if len(input) == 0 || !json.Valid(input) {
		input = t.toolInputs[ev.ID]
	}
	if len(input) == 0 {
		input = json.RawMessage("null")
	}
	t.requests = append(t.requests, record.ApprovalRequest{ApprovalID: "apr_" + ulid.Make().String(), ToolCallID: ev.ID, ToolName: name, Input: input})
	return outcome{}, true
}

func (t *turn) appendText(typ, delta string) {
	if t.text.Len() > 0 && t.textType != typ {
		t.endText()
	}
	t.textType = typ
	t.text.WriteString(delta)
}

// endText moves the growing text part into parts.
func (t *turn) endText() {
	if t.text.Len() == 0 {
		return
	}
	t.parts = append(t.parts, record.Part{Type: t.textType, Text: t.text.String()})
	t.text = strings.Builder{}
}

func (t *turn) publish(f wire.DeltaFrame) {
	if t.deltas == nil {
		return
	}
	f.TurnID, f.SubmissionID = t.id, t.primary()
	t.deltas.add(f)
}

// assistantRecord takes the message streamed so far, if any.
func (t *turn) assistantRecord(data json.RawMessage) []record.Record {
	t.endText()
	if len(data) > 0 && json.Valid(data) {
		t.parts = append(t.parts, record.Part{Type: record.PartData, Name: "result", Data: data})
	}
	if len(t.parts) == 0 {
		return nil
	}
	payload, _ := json.Marshal(record.MessagePayload{Parts: t.parts})
	t.parts, t.partBytes = nil, 0
	return []record.Record{record.EntryRecord(record.Entry{Type: record.EntryAssistantMessage, Payload: payload})}
}

func (t *turn) flushMessage(ctx context.Context) error {
	recs := t.assistantRecord(nil)
	if len(recs) == 0 {
		return nil
	}
	return t.append(ctx, recs...)
}

func (t *turn) append(ctx context.Context, recs ...record.Record) error {
	for i := range recs {
		if recs[i].Entry != nil {
			recs[i].Entry.SubmissionID, recs[i].Entry.TurnID = t.primary(), t.id
		}
	}
	// Not ctx: what the agent did must be recorded even as we are aborted.
	_, err := t.write(context.WithoutCancel(ctx), clog.Write{Key: t.key, Records: recs, TurnID: t.id, Incarnation: t.inc})
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
	var err error
	if res.await {
		err = t.writeAwait(ctx, recs)
		if errors.Is(err, clog.ErrBatchTooLarge) && len(recs) > 0 {
			// The reply first, on its own, then the wait.
			if err = t.append(ctx, recs...); err == nil {
				err = t.writeAwait(ctx, nil)
			} else if errors.Is(err, clog.ErrBatchTooLarge) {
				res = replyTooLarge(err)
				err = t.writeSettlements(ctx, nil, res)
			}
		}
	} else {
		err = t.writeSettlements(ctx, recs, res)
	}
	if !res.await && errors.Is(err, clog.ErrBatchTooLarge) && len(recs) > 0 {
		// Together over the batch limit: the reply first, on its own.
		// Settled or not, what the agent said stays recorded.
		if err = t.append(ctx, recs...); err == nil {
			err = t.writeSettlements(ctx, nil, res)
		} else if errors.Is(err, clog.ErrBatchTooLarge) {
			err = t.writeSettlements(ctx, nil, replyTooLarge(err))
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, clog.ErrIncarnationChanged):
		return nil // reset at the last moment: the reset settled them
	case errors.Is(err, clog.ErrSubmissionNotFound):
		// The conversation was deleted with purge under the turn: its
		// submissions, and what the turn would have answered, are gone.
		// An expected race, not a failure of ours.
		t.p.logger.Debug("worker: the conversation was purged under a running turn; nothing to settle", "session", t.key.String(), "turn", t.id)
		return nil
	case errors.Is(err, clog.ErrSubmissionSettled), errors.Is(err, clog.ErrSubmissionState):
		return fmt.Errorf("settle turn %s: %w", t.id, err)
	}
	// Refused for another reason: settle with what happened, so that the
	// submissions do not stay running until a sweep calls them interrupted.
	if ferr := t.writeSettlements(ctx, nil, storageFailure(err)); ferr == nil {
		t.p.logger.Error("worker: the turn's reply could not be stored; settled failed", "session", t.key.String(), "turn", t.id, "err", err)
		return nil
	}
	return fmt.Errorf("settle turn %s: %w", t.id, err)
}

// writeSettlements writes recs and one settlement per submission of the
// turn, all with res, in one write.
func (t *turn) writeSettlements(ctx context.Context, recs []record.Record, res outcome) error {
	if res.reset {
		return nil
	}
	for i := range recs {
		recs[i].Entry.SubmissionID, recs[i].Entry.TurnID = t.primary(), t.id
	}
	w := clog.Write{Key: t.key, Records: recs, TurnID: t.id, Incarnation: t.inc}
	for _, s := range t.subs {
		st := record.Settlement{SubmissionID: s.ID, Outcome: res.outcome, Error: res.failure}
		if s.ID != t.primary() {
			st.AnsweredBySubmissionID = t.primary()
		}
		w.Settle = append(w.Settle, st)
	}
	// A full disk may clear soon; the reply is only in memory meanwhile.
	return retryNoSpace(ctx, t.p.logger, "settle turn "+t.id, func() error {
		_, err := t.write(context.WithoutCancel(ctx), w)
		return err
	})
}

// writeAwait writes recs and the turn's approval requests in one write:
// the submission becomes input_required, unsettled, until a person
// decides (log.DB.Decide) and a new turn resumes it.
func (t *turn) writeAwait(ctx context.Context, recs []record.Record) error {
	for i := range recs {
		recs[i].Entry.SubmissionID, recs[i].Entry.TurnID = t.primary(), t.id
	}
	opts, _ := t.p.cfg.Agents.Options(t.key.Agent)
	w := clog.Write{Key: t.key, Records: recs, TurnID: t.id, Incarnation: t.inc, Await: &clog.Await{
		SubmissionID: t.primary(), Requests: t.requests, Timeout: opts.ApprovalTimeout,
	}}
	err := retryNoSpace(ctx, t.p.logger, "await turn "+t.id, func() error {
		_, err := t.write(context.WithoutCancel(ctx), w)
		return err
	})
	if err == nil && opts.ApprovalTimeout > 0 {
		if sub, serr := t.p.cfg.Log.Submission(context.WithoutCancel(ctx), t.primary()); serr == nil {
			t.p.approvals.Arm(sub)
		}
	}
	return err
}

// principalOf reads the principal the HTTP layer recorded in a user
// message's metadata ("principal": {"issuer","subject"}), if any.
func principalOf(meta json.RawMessage) *worker.Principal {
	var m struct {
		Principal *worker.Principal `json:"principal"`
	}
	if len(meta) == 0 || json.Unmarshal(meta, &m) != nil || m.Principal == nil || m.Principal.Subject == "" {
		return nil
	}
	return m.Principal
}

// dataURLImage takes an inline image part (a data: URL) as a prompt image.
func dataURLImage(p record.Part) (worker.Image, bool) {
	rest, ok := strings.CutPrefix(p.URL, "data:")
	if !ok {
		return worker.Image{}, false
	}
	meta, data, ok := strings.Cut(rest, ",")
	mime, isBase64 := strings.CutSuffix(meta, ";base64")
	if !ok || !isBase64 || !strings.HasPrefix(mime, "image/") {
		return worker.Image{}, false
	}
	return worker.Image{MimeType: mime, Data: data}, true
}
