package worker

import (
	"context"
	"encoding/json"
	"iter"
)

// Agent is the Agent Handler contract: one Invoke is one turn.
//
// The Go form of the contract's MUSTs:
//  1. Iterated to its end, the sequence yields exactly one terminal event,
//     Completed or Failed, and nothing after it.
//  2. Failures are Failed events; Invoke does not panic. (The pool recovers
//     a panic anyway and settles the turn failed, code "agent_panic".)
//  3. When the caller stops iterating (yield returns false) or ctx ends, the
//     agent stops its work promptly and returns; no terminal is expected.
type Agent interface {
	Invoke(ctx context.Context, scope Scope, prompt Prompt) iter.Seq[Event]
}

// AgentFunc adapts a function to Agent.
type AgentFunc func(ctx context.Context, scope Scope, prompt Prompt) iter.Seq[Event]

// Invoke calls f.
func (f AgentFunc) Invoke(ctx context.Context, scope Scope, prompt Prompt) iter.Seq[Event] {
	return f(ctx, scope, prompt)
}

// Scope anchors a turn in its conversation. Session is the same for every
// turn of one conversation: "agent/instance/session".
type Scope struct {
	Session  string `json:"session"`
	Agent    string `json:"agent"`
	Instance string `json:"instance"`
	// TurnID is the turn being run: for logs and tracing, not for state.
	TurnID string `json:"turnId,omitempty"`
	// Principal is who delivered the turn's own submission, when access
	// control is on; nil otherwise.
	Principal *Principal `json:"principal,omitempty"`
}

// Principal is an authenticated caller: the token's issuer ("" for a
// static token) and subject.
type Principal struct {
	Issuer  string `json:"issuer,omitempty"`
	Subject string `json:"subject"`
}

// Prompt is what the turn answers: the text of every submission it answers,
// in order, separated by blank lines, and their images.
//
// Resume is set when the turn continues a submission that stopped to ask
// a person (see EventApprovalRequested): every request is decided, and
// the same submission is invoked again with the decisions, in the order
// the calls were requested. Text and Images are then the submission's
// own, as on its first invoke. (On the wire of http and exec agents it is
// the request's "resume" member, beside "prompt": see package agentwire.)
type Prompt struct {
	Text   string  `json:"text"`
	Images []Image `json:"images,omitempty"`
	Resume *Resume `json:"-"`
}

// Resume carries a person's decisions on the tool calls a turn asked to
// have approved. It is the "resume" member of an http or exec agent's
// request.
type Resume struct {
	Decisions []Decision `json:"decisions"`
}

// Decision is one decided approval request.
//
// ToolCallID, ToolName and Args are the approval_requested event's ID,
// Name and Args. Approved says whether the call may run; Input, for an
// approved call only, is the arguments as the person edited them (the
// call runs with Input when it is set, else with Args). Reason is the
// person's, optional; a request denied because approvalTimeout expired
// has Reason "timeout" (ReasonTimeout).
type Decision struct {
	ApprovalID string          `json:"approvalId"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Args       json.RawMessage `json:"args"`
	Approved   bool            `json:"approved"`
	Reason     string          `json:"reason,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
}

// ReasonTimeout is the Reason of a request denied because the agent's
// approvalTimeout expired before a person decided.
const ReasonTimeout = "timeout"

// Image is an inline image of a prompt.
type Image struct {
	MimeType string `json:"mimeType"`
	Data     string `json:"data"` // base64
}

// Event types. Completed and Failed are the only terminals, and that set is
// frozen: any other type is non-terminal, and the pool ignores types it does
// not know.
const (
	EventText        = "text"
	EventThinking    = "thinking"
	EventToolStarted = "tool_started"
	// EventToolInputDelta is a fragment of a tool call's arguments as the
	// model writes them, before its tool_started (presentation only).
	EventToolInputDelta = "tool_input_delta"
	EventToolEnded      = "tool_ended"
	EventRetrying       = "retrying"
	// EventApprovalRequested asks a person to approve tool call ID (its
	// Name and Args as in its tool_started) before it runs; Reason, when
	// set, says why. The agent does not run the call: it ends the invoke
	// with Completed. The runner then stops the turn without settling the
	// submission, which waits as input_required with the call pending;
	// once every pending call is decided, the same submission is invoked
	// again with Prompt.Resume.
	EventApprovalRequested = "approval_requested"
	EventCompleted         = "completed"
	EventFailed            = "failed"
)

// Event is one element of a turn's stream. Which fields are set depends on
// Type, as in the contract.
type Event struct {
	Type string `json:"type"`

	Delta string `json:"delta,omitempty"` // text, thinking

	ID      string          `json:"id,omitempty"`      // tool_started, tool_ended, approval_requested
	Name    string          `json:"name,omitempty"`    // tool_started, approval_requested
	Args    json.RawMessage `json:"args,omitempty"`    // tool_started, approval_requested
	IsError bool            `json:"isError,omitempty"` // tool_ended
	Content json.RawMessage `json:"content,omitempty"` // tool_ended

	Attempt     int    `json:"attempt,omitempty"`     // retrying
	MaxAttempts int    `json:"maxAttempts,omitempty"` // retrying
	DelayMs     int64  `json:"delayMs,omitempty"`     // retrying
	Reason      string `json:"reason,omitempty"`      // retrying, approval_requested (optional)

	Data json.RawMessage `json:"data,omitempty"` // completed

	Details   string `json:"details,omitempty"`   // failed
	Retryable bool   `json:"retryable,omitempty"` // failed
	Code      string `json:"code,omitempty"`      // failed

	// Raw is the event as an out-of-process agent sent it. An event of a
	// type the pool does not know is relayed to live readers as Raw,
	// unchanged; one without Raw is relayed as its JSON encoding.
	Raw json.RawMessage `json:"-"`
}

// Text is a text delta.
func Text(delta string) Event { return Event{Type: EventText, Delta: delta} }

// Thinking is a reasoning delta.
func Thinking(delta string) Event { return Event{Type: EventThinking, Delta: delta} }

// ToolStarted begins tool call id.
func ToolStarted(id, name string, args json.RawMessage) Event {
	return Event{Type: EventToolStarted, ID: id, Name: name, Args: args}
}

// ToolInputDelta is a fragment of the arguments of tool call id.
func ToolInputDelta(id, name, delta string) Event {
	return Event{Type: EventToolInputDelta, ID: id, Name: name, Delta: delta}
}

// ToolEnded ends tool call id.
func ToolEnded(id string, isError bool, content json.RawMessage) Event {
	return Event{Type: EventToolEnded, ID: id, IsError: isError, Content: content}
}

// ApprovalRequested asks a person to approve tool call id before it runs.
// Set Reason on the result to say why.
func ApprovalRequested(id, name string, args json.RawMessage) Event {
	return Event{Type: EventApprovalRequested, ID: id, Name: name, Args: args}
}

// Completed ends a turn in success.
func Completed(data json.RawMessage) Event { return Event{Type: EventCompleted, Data: data} }

// Failed ends a turn in failure.
func Failed(details string, retryable bool, code string) Event {
	return Event{Type: EventFailed, Details: details, Retryable: retryable, Code: code}
}
