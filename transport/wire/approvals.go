package wire

import (
	"encoding/json"

	"github.com/convlog/convlog/log/record"
)

// MaxDecisions bounds the decisions of one approvals request (its body:
// {"decisions": [{"approvalId", "approved", "reason"?, "input"?}]},
// docs/protocol.md 2.12).
const MaxDecisions = 256

// DecideRequest is the body of POST .../submissions/{id}/approvals.
type DecideRequest struct {
	Decisions []Decision `json:"decisions"`
}

// Decision is a person's answer to one pending approval. Input, with an
// approval only, replaces the tool call's arguments.
type Decision struct {
	ApprovalID string          `json:"approvalId"`
	Approved   bool            `json:"approved"`
	Reason     string          `json:"reason,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
}

// Decided is the 202 body of a decision. Offset is where the stored
// decisions start: reading from it returns them first, then the resumed
// turn once nothing is left pending.
type Decided struct {
	SubmissionID string                   `json:"submissionId"`
	Status       record.Status            `json:"status"`
	Pending      []record.ApprovalRequest `json:"pending"`
	Offset       record.Offset            `json:"offset"`
	NextOffset   record.Offset            `json:"nextOffset"`
	StatusURL    string                   `json:"statusUrl"`
	UpdatesURL   string                   `json:"updatesUrl"`
}
