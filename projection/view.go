package projection

import (
	"bytes"
	"encoding/json"

	"github.com/convlog/convlog/log/record"
)

// Message roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// View is the projection of a record sequence.
type View struct {
	Messages    []Message           `json:"messages"`
	Settlements []record.Settlement `json:"settlements"`
}

// Message is one user_message or assistant_message entry on the active path.
// Purpose and Display are the payload's own (record.Purpose*, record.Display*),
// defaulted when the payload leaves them empty; values this package does not
// know are passed through so that a newer producer's intent reaches the
// client.
type Message struct {
	ID           string          `json:"id"`
	Role         string          `json:"role"`
	Purpose      string          `json:"purpose"`
	Display      string          `json:"display"`
	SubmissionID string          `json:"submissionId,omitempty"`
	TurnID       string          `json:"turnId,omitempty"`
	Metadata     json.RawMessage `json:"metadata,omitempty"`
	Parts        []Part          `json:"parts"`
}

func newMessage(e *record.Entry, p *record.MessagePayload, role, purpose string) Message {
	m := Message{
		ID:           e.ID,
		Role:         role,
		Purpose:      p.Purpose,
		Display:      p.Display,
		SubmissionID: e.SubmissionID,
		TurnID:       e.TurnID,
		Metadata:     p.Metadata,
		Parts:        make([]Part, 0, len(p.Parts)),
	}
	if m.Purpose == "" {
		m.Purpose = purpose
	}
	if m.Display == "" {
		m.Display = record.DisplayVisible
	}
	// A null metadata is no metadata; keeping it would put "metadata": null
	// on the wire for a payload that never meant to set any.
	if bytes.Equal(m.Metadata, []byte("null")) {
		m.Metadata = nil
	}
	for _, lp := range p.Parts {
		if part, ok := partFromPayload(lp); ok {
			m.Parts = append(m.Parts, part)
		}
	}
	return m
}

// clone copies m down to the bytes, so that neither a later tool result nor
// a caller editing its copy can reach the other's.
func (m Message) clone() Message {
	m.Metadata = bytes.Clone(m.Metadata)
	parts := make([]Part, len(m.Parts))
	for i, p := range m.Parts {
		parts[i] = p.clone()
	}
	m.Parts = parts
	return m
}

func cloneSettlement(s record.Settlement) record.Settlement {
	if s.Error != nil {
		f := *s.Error
		s.Error = &f
	}
	return s
}
