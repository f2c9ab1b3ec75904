package record

import "time"

// Status is where a submission is in its life.
type Status string

// Submission statuses. Completed, failed and aborted are terminal.
const (
	StatusAdmitted  Status = "admitted"
	StatusRunning   Status = "running"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusAborted   Status = "aborted"
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
}
