package record

import (
	"encoding/json"
	"time"
)

// Status is where a submission is in its life.
type Status string

// Submission statuses. Completed, failed and aborted are terminal.
// InputRequired is not: the submission waits, unsettled and held by no
// process, for decisions on its approval requests, and runs again (a new
// turn) once all are decided.
const (
	StatusAdmitted      Status = "admitted"
	StatusRunning       Status = "running"
	StatusInputRequired Status = "input_required"
	StatusCompleted     Status = "completed"
	StatusFailed        Status = "failed"
	StatusAborted       Status = "aborted"
)

// Terminal reports whether s is a final status.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusAborted
}

// Submission is one admitted delivery and what became of it. It is written
// in the same transaction as the records that change it, so the stream and
// the submission never disagree.
type Submission struct {
	ID     string `json:"submissionId"`
	Key    Key    `json:"-"`
	Offset Offset `json:"offset"`
	Status Status `json:"status"`
	// EntryID is the id of the first entry admitted with the submission,
	// normally its user message.
	EntryID string `json:"entryId,omitempty"`
	// TurnID is the turn that ran (or answered) the submission.
	TurnID                 string    `json:"turnId,omitempty"`
	Error                  *Failure  `json:"error,omitempty"`
	AnsweredBySubmissionID string    `json:"answeredBySubmissionId,omitempty"`
	AdmittedAt             time.Time `json:"admittedAt"`
	StartedAt              time.Time `json:"startedAt,omitzero"`
	SettledAt              time.Time `json:"settledAt,omitzero"`

	// UID is the instance generation the submission was admitted to.
	UID string `json:"uid,omitempty"`

	// Approvals are the requests of the submission's last wait and their
	// decisions. They are the state machine the log checks decisions
	// against, in the committing transaction; readers see Pending.
	Approvals []Approval `json:"-"`
	// Pending are the undecided requests while the submission is
	// input_required, in request order. It is derived from Approvals when
	// the submission is read, never stored.
	Pending []ApprovalRequest `json:"pending,omitempty"`
	// ApprovalDeadline, when set, is when the undecided requests are
	// denied with ReasonTimeout.
	ApprovalDeadline time.Time `json:"approvalDeadline,omitzero"`
	// WaitingSince is when the submission last began to wait, kept for
	// the time to decision.
	WaitingSince time.Time `json:"waitingSince,omitzero"`
}

// Waiting reports whether s waits for a person: input_required with
// requests undecided. A waiting submission cannot start.
func (s Submission) Waiting() bool {
	return s.Status == StatusInputRequired && len(s.Pending) > 0
}

// Resumable reports whether every request of s's wait is decided and it
// has not run again yet: a Write.Start takes it to running as a new turn.
// It stays input_required (with no pending requests) until then.
func (s Submission) Resumable() bool {
	return s.Status == StatusInputRequired && len(s.Approvals) > 0 && len(s.Pending) == 0
}

// Runnable reports whether a turn may start s: admitted, or resumable.
func (s Submission) Runnable() bool {
	return s.Status == StatusAdmitted || s.Resumable()
}

// PendingOf returns the undecided requests of approvals, in order; nil
// when there are none.
func PendingOf(approvals []Approval) []ApprovalRequest {
	var out []ApprovalRequest
	for _, a := range approvals {
		if !a.Decided {
			out = append(out, a.ApprovalRequest)
		}
	}
	return out
}

// ApprovalRequest is one tool call that needs a person's approval before
// it runs: an element of an approval_request entry and of a submission's
// Pending.
type ApprovalRequest struct {
	ApprovalID string          `json:"approvalId"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Input      json.RawMessage `json:"input"`
}

// Approval is a request as the submission stores it, with its decision.
type Approval struct {
	ApprovalRequest
	Decided  bool
	Approved bool
	Reason   string
	// EditedInput are the arguments the approver gave instead of Input
	// (an approval only).
	EditedInput json.RawMessage
	DecidedAt   time.Time
}
