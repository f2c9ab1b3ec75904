package log

import "github.com/convlog/convlog/log/record"

// storedSubmission is the bbolt form: the public fields plus the key and
// sequence, which the wire form leaves out.
type storedSubmission struct {
	record.Submission
	Agent    string `json:"agent"`
	Instance string `json:"instance"`
	Session  string `json:"session"`
	// Seq is the admission order, the key of the queue and the outbox.
	Seq uint64 `json:"seq"`
}

// derivePending sets Pending from Approvals: the undecided requests while
// the submission waits, none otherwise (a voided wait shows nothing
// pending).
func (s *storedSubmission) derivePending() {
	s.Pending = nil
	if s.Status == record.StatusInputRequired {
		s.Pending = record.PendingOf(s.Approvals)
	}
}
