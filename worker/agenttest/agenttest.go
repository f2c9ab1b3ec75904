// Package agenttest is the conformance kit of the Agent Handler contract:
// an Agent implementation runs Run in its own tests to check the MUSTs the
// pool relies on.
//
//   - MUST 1: iterated to its end, the sequence yields exactly one terminal
//     event (completed or failed) and nothing after it.
//   - MUST 2: failures are events: Invoke and the iteration do not panic.
//   - MUST 3: after the caller stops iterating, or cancels the context, the
//     agent returns within a bound the test sets, and yields nothing more.
//   - Every event is JSON-serialisable and survives a round trip.
//   - A relaying agent (one whose events come from elsewhere) passes event
//     types it does not know through unchanged (relay MUST 5).
//   - An agent that asks for approvals (Options.Approval) ends the asking
//     turn completed, with each approval_requested naming a distinct call
//     (id and name) that it did not end; invoked again with Prompt.Resume,
//     approving or denying every call, it runs a turn to its end without
//     asking again about the calls decided.
package agenttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/convlog/convlog/worker"
)

// Options says how to drive the agent under test.
type Options struct {
	// Scope of every invocation; a default scope is used when empty.
	Scope worker.Scope
	// Prompt makes the agent run a turn to its end (completed or failed).
	// Required.
	Prompt worker.Prompt
	// Long makes the agent stream at least two events before its terminal,
	// slowly enough that a stop lands mid-turn (MUST 3). Default Prompt.
	Long *worker.Prompt
	// StopBound is how long the agent may take to return after the caller
	// stops. Default 2s.
	StopBound time.Duration
	// TurnBound bounds a whole turn of Prompt. Default 30s.
	TurnBound time.Duration
	// Unknown, for a relaying agent, makes its source send an event of a
	// type convlog does not know; UnknownRaw is that event's JSON as sent.
	// Run checks the agent yields it with Raw equal to it (compared as
	// JSON values). Nil skips the check.
	Unknown    *worker.Prompt
	UnknownRaw json.RawMessage
	// Approval makes the agent ask for at least one approval
	// (approval_requested). Nil skips the approval checks.
	Approval *worker.Prompt
}

func (o *Options) defaults() {
	if o.Scope == (worker.Scope{}) {
		o.Scope = worker.Scope{Session: "agenttest/i/default", Agent: "agenttest", Instance: "i"}
	}
	if o.Long == nil {
		o.Long = &o.Prompt
	}
	if o.StopBound <= 0 {
		o.StopBound = 2 * time.Second
	}
	if o.TurnBound <= 0 {
		o.TurnBound = 30 * time.Second
	}
}

// Run checks agent against the contract, each check a subtest.
func Run(t *testing.T, agent worker.Agent, opts Options) {
	t.Helper()
	opts.defaults()
	t.Run("MUST1_one_terminal_last", func(t *testing.T) {
		evs, err := Collect(context.Background(), agent, opts.Scope, opts.Prompt, opts.TurnBound)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckTerminal(evs); err != nil {
			t.Fatal(err)
		}
		for i, ev := range evs {
			if err := CheckJSON(ev); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
	})
	t.Run("MUST3_stop_iterating", func(t *testing.T) {
		if err := CheckStop(agent, opts.Scope, *opts.Long, opts.StopBound, false); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("MUST3_cancel_context", func(t *testing.T) {
		if err := CheckStop(agent, opts.Scope, *opts.Long, opts.StopBound, true); err != nil {
			t.Fatal(err)
		}
	})
	if opts.Unknown != nil {
		t.Run("MUST5_unknown_relayed", func(t *testing.T) {
			evs, err := Collect(context.Background(), agent, opts.Scope, *opts.Unknown, opts.TurnBound)
			if err != nil {
				t.Fatal(err)
			}
			if err := CheckTerminal(evs); err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				if sameJSON(ev.Raw, opts.UnknownRaw) {
					return
				}
			}
			t.Fatalf("the unknown event %s was not relayed unchanged; got %+v", opts.UnknownRaw, evs)
		})
	}
	if opts.Approval != nil {
		t.Run("approval_asked_then_resumed", func(t *testing.T) { runApproval(t, agent, opts) })
	}
}

// runApproval is the approval check of Run: the asking turn, then a
// resume approving every call and one denying every call.
func runApproval(t *testing.T, agent worker.Agent, opts Options) {
	evs, err := Collect(context.Background(), agent, opts.Scope, *opts.Approval, opts.TurnBound)
	if err != nil {
		t.Fatal(err)
	}
	asked, err := CheckApproval(evs)
	if err != nil {
		t.Fatal(err)
	}
	if len(asked) == 0 {
		t.Fatalf("the Approval prompt asked for no approval: %+v", evs)
	}
	for _, approved := range []bool{true, false} {
		p := *opts.Approval
		p.Resume = &worker.Resume{}
		for i, ev := range asked {
			d := worker.Decision{ApprovalID: fmt.Sprintf("agenttest_%d", i), ToolCallID: ev.ID, ToolName: ev.Name, Args: ev.Args, Approved: approved}
			if !approved {
				d.Reason = "agenttest denies it"
			}
			p.Resume.Decisions = append(p.Resume.Decisions, d)
		}
		evs, err := Collect(context.Background(), agent, opts.Scope, p, opts.TurnBound)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckTerminal(evs); err != nil {
			t.Fatalf("resumed (approved %v): %v", approved, err)
		}
		for _, ev := range evs {
			for _, a := range asked {
				if ev.Type == worker.EventApprovalRequested && ev.ID == a.ID {
					t.Fatalf("resumed (approved %v): asked again about the decided call %q", approved, a.ID)
				}
			}
		}
	}
}

// CheckApproval checks a turn that asked for approvals: it ends
// completed, and each approval_requested has an id and a name, names a
// call no other one names, and is not followed by that call's tool_ended.
// It returns the approval_requested events.
func CheckApproval(evs []worker.Event) (asked []worker.Event, err error) {
	if err := CheckTerminal(evs); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, ev := range evs {
		switch ev.Type {
		case worker.EventApprovalRequested:
			if ev.ID == "" || ev.Name == "" {
				return nil, fmt.Errorf("approval_requested without an id or a name: %+v", ev)
			}
			if seen[ev.ID] {
				return nil, fmt.Errorf("approval_requested twice for call %q", ev.ID)
			}
			seen[ev.ID] = true
			asked = append(asked, ev)
		case worker.EventToolEnded:
			if seen[ev.ID] {
				return nil, fmt.Errorf("call %q ended after its approval_requested: a held call must not run", ev.ID)
			}
		}
	}
	if last := evs[len(evs)-1]; len(asked) > 0 && last.Type != worker.EventCompleted {
		return nil, fmt.Errorf("a turn that asked for approval must end completed, not %q", last.Type)
	}
	return asked, nil
}

// Collect iterates one turn to its end within bound, recovering a panic
// into an error (MUST 2) and refusing events after the terminal (MUST 1).
func Collect(ctx context.Context, agent worker.Agent, scope worker.Scope, prompt worker.Prompt, bound time.Duration) (evs []worker.Event, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		evs []worker.Event
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.err = fmt.Errorf("MUST 2: the agent panicked: %v", p)
			}
			done <- r
		}()
		terminal := false
		for ev := range agent.Invoke(ctx, scope, prompt) {
			if terminal {
				r.err = fmt.Errorf("MUST 1: event %q after the terminal", ev.Type)
				return
			}
			r.evs = append(r.evs, ev)
			terminal = isTerminal(ev)
		}
	}()
	select {
	case r := <-done:
		return r.evs, r.err
	case <-time.After(bound):
		cancel()
		return nil, fmt.Errorf("the turn did not end within %v", bound)
	}
}

// CheckTerminal is MUST 1 on a complete sequence.
func CheckTerminal(evs []worker.Event) error {
	n := 0
	for _, ev := range evs {
		if isTerminal(ev) {
			n++
		}
	}
	switch {
	case len(evs) == 0:
		return fmt.Errorf("MUST 1: no event at all")
	case n != 1:
		return fmt.Errorf("MUST 1: %d terminal events", n)
	case !isTerminal(evs[len(evs)-1]):
		return fmt.Errorf("MUST 1: the last event is %q", evs[len(evs)-1].Type)
	}
	return nil
}

// CheckJSON checks an event is JSON-serialisable and round-trips.
func CheckJSON(ev worker.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("not JSON-serialisable: %w", err)
	}
	var back worker.Event
	if err := json.Unmarshal(b, &back); err != nil {
		return fmt.Errorf("does not decode back: %w", err)
	}
	if back.Type != ev.Type || back.Delta != ev.Delta || back.Code != ev.Code || back.ID != ev.ID {
		return fmt.Errorf("round trip changed it: %s", b)
	}
	if ev.Type == "" {
		return fmt.Errorf("event without a type: %s", b)
	}
	return nil
}

// CheckStop is MUST 3: it starts a turn, stops after its first event (by
// breaking out of the loop, or by cancelling the context when cancelCtx),
// and requires Invoke's sequence to return within bound and to yield
// nothing after a break.
func CheckStop(agent worker.Agent, scope worker.Scope, prompt worker.Prompt, bound time.Duration, cancelCtx bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seq := agent.Invoke(ctx, scope, prompt)
	first := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("MUST 2: the agent panicked: %v", p)
			}
			done <- err
		}()
		n := 0
		broke := false
		seq(func(ev worker.Event) bool {
			if broke {
				err = fmt.Errorf("MUST 3: yield called again (%q) after it returned false", ev.Type)
				return false
			}
			n++
			if n == 1 {
				close(first)
				if !cancelCtx {
					broke = true
					return false
				}
				cancel()
			}
			return true
		})
		if n == 0 {
			close(first)
		}
	}()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("no first event within 30s")
	}
	select {
	case err := <-done:
		return err
	case <-time.After(bound):
		return fmt.Errorf("MUST 3: the agent had not returned %v after the caller stopped", bound)
	}
}

func isTerminal(ev worker.Event) bool {
	return ev.Type == worker.EventCompleted || ev.Type == worker.EventFailed
}

func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
