package wire

import "encoding/json"

// Frame types of the SSE stream's data. Conversation frames are durable
// and carry an id (the offset to resume from); everything else the
// DeltaSource sends is presentation-only and carries none.
const (
	FrameConversation = "conversation"
	FrameError        = "error"
)

// Presentation frame types: the live deltas of a running turn, as a
// DeltaFrame's Type. They are never stored and never replayed; the
// conversation records of the same turn supersede them.
const (
	FrameDelta         = "delta"
	FrameToolCallDelta = "toolcall_delta"
	FrameRetrying      = "retrying"
	// FrameEvent relays an agent event of a type convlog does not know,
	// unchanged, in Event (the contract's relay MUST 5).
	FrameEvent = "event"
)

// DeltaFrame is a presentation frame: what the worker publishes while a
// turn runs, and what readers receive in SSE data (docs/protocol.md,
// section 4.1). It is the one definition of its JSON form, for the
// producer (worker/pool over worker/natsbus) and the consumers (the SSE
// stream relays it unchanged; the turn view of the client adapters reads
// it).
type DeltaFrame struct {
	Type         string `json:"type"`
	TurnID       string `json:"turnId"`
	SubmissionID string `json:"submissionId"`

	// delta: Kind is "text" or "reasoning".
	Kind  string `json:"kind,omitempty"`
	Delta string `json:"delta,omitempty"`

	// toolcall_delta: a tool call began.
	ToolCallID string          `json:"toolCallId,omitempty"`
	ToolName   string          `json:"toolName,omitempty"`
	Args       json.RawMessage `json:"args,omitempty"`
	// ArgsDelta is a fragment of the arguments' JSON text while the model
	// writes them; the frame with Args follows once they are complete.
	ArgsDelta string `json:"argsDelta,omitempty"`

	// retrying: the agent's advisory backoff.
	Attempt     int    `json:"attempt,omitempty"`
	MaxAttempts int    `json:"maxAttempts,omitempty"`
	DelayMs     int64  `json:"delayMs,omitempty"`
	Reason      string `json:"reason,omitempty"`

	// event: the agent's event, byte for byte.
	Event json.RawMessage `json:"event,omitempty"`
}
