package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// Record kinds.
const (
	KindEntry     = "entry"
	KindTruncated = "truncated"
)

// Built-in entry types. Any other type is a custom entry: stored and served
// untouched, ignored by the projection.
const (
	EntryUserMessage      = "user_message"
	EntryAssistantMessage = "assistant_message"
	EntryToolResult       = "tool_result"
	EntrySettlement       = "settlement"
	// EntryApprovalRequest lists the tool calls of a turn that wait for a
	// person's decision (ApprovalRequestPayload); it is written with the
	// submission's move to StatusInputRequired.
	EntryApprovalRequest = "approval_request"
	// EntryApprovalDecision is one person's (or the timeout's) decision on
	// one request (ApprovalDecisionPayload).
	EntryApprovalDecision = "approval_decision"
)

// Record is one element of a stream: an entry, or a truncation that moves the
// stream's leaf back to an earlier entry (a branch of the conversation path).
type Record struct {
	Kind string `json:"kind"`

	// Entry is set when Kind is KindEntry.
	Entry *Entry `json:"entry,omitempty"`

	// RewoundTo, NewLeafID and Reason are set when Kind is KindTruncated.
	// RewoundTo is the entry the path returns to ("" for the very start);
	// NewLeafID is the leaf after the truncation, normally RewoundTo.
	RewoundTo string `json:"-"`
	NewLeafID string `json:"-"`
	Reason    string `json:"-"`
}

// Entry is a durable conversation event.
type Entry struct {
	ID           string          `json:"id"`
	ParentID     string          `json:"parentId"`
	Timestamp    time.Time       `json:"timestamp"`
	Type         string          `json:"type"`
	SubmissionID string          `json:"submissionId,omitempty"`
	TurnID       string          `json:"turnId,omitempty"`
	Payload      json.RawMessage `json:"payload"`
}

// EntryRecord wraps an entry in a record.
func EntryRecord(e Entry) Record { return Record{Kind: KindEntry, Entry: &e} }

// TruncatedRecord makes a truncation back to rewoundTo.
func TruncatedRecord(rewoundTo, reason string) Record {
	return Record{Kind: KindTruncated, RewoundTo: rewoundTo, NewLeafID: rewoundTo, Reason: reason}
}

type truncatedJSON struct {
	Kind      string `json:"kind"`
	RewoundTo string `json:"rewoundTo"`
	NewLeafID string `json:"newLeafId"`
	Reason    string `json:"reason"`
}

type entryJSON struct {
	Kind  string `json:"kind"`
	Entry *Entry `json:"entry"`
}

// MarshalJSON writes the wire shape of the record's kind.
func (r Record) MarshalJSON() ([]byte, error) {
	switch r.Kind {
	case KindTruncated:
		return marshalNoHTML(truncatedJSON{Kind: r.Kind, RewoundTo: r.RewoundTo, NewLeafID: r.NewLeafID, Reason: r.Reason})
	case KindEntry:
		return marshalNoHTML(entryJSON{Kind: r.Kind, Entry: r.Entry})
	default:
		return nil, fmt.Errorf("%w: record kind %q", ErrInvalidRecord, r.Kind)
	}
}

// UnmarshalJSON reads any record. A record of an unknown kind decodes with
// only Kind set, so that readers can skip it.
func (r *Record) UnmarshalJSON(b []byte) error {
	var head struct {
		Kind      string          `json:"kind"`
		Entry     json.RawMessage `json:"entry"`
		RewoundTo string          `json:"rewoundTo"`
		NewLeafID string          `json:"newLeafId"`
		Reason    string          `json:"reason"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRecord, err)
	}
	*r = Record{Kind: head.Kind}
	switch head.Kind {
	case KindEntry:
		if len(head.Entry) == 0 || bytes.Equal(head.Entry, []byte("null")) {
			return fmt.Errorf("%w: entry record without entry", ErrInvalidRecord)
		}
		var e Entry
		if err := json.Unmarshal(head.Entry, &e); err != nil {
			return fmt.Errorf("%w: entry: %v", ErrInvalidRecord, err)
		}
		r.Entry = &e
	case KindTruncated:
		r.RewoundTo, r.NewLeafID, r.Reason = head.RewoundTo, head.NewLeafID, head.Reason
	}
	return nil
}

// Limits on what a record may hold. They keep one batch within a sane size
// for a single bbolt value and a single HTTP frame.
const (
	MaxIDLength     = 128
	MaxTypeLength   = 128
	MaxReasonLength = 1024
	MaxRecordsBatch = 1024
	MaxBatchBytes   = 16 << 20
)

// Validate checks what the caller supplied, before the engine fills in ids,
// parents and timestamps.
func (r *Record) Validate() error {
	switch r.Kind {
	case KindEntry:
		e := r.Entry
		if e == nil {
			return fmt.Errorf("%w: entry record without entry", ErrInvalidRecord)
		}
		if e.Type == "" || len(e.Type) > MaxTypeLength || !Printable(e.Type) {
			return fmt.Errorf("%w: entry type %q", ErrInvalidRecord, e.Type)
		}
		for _, id := range []string{e.ID, e.ParentID, e.SubmissionID, e.TurnID} {
			if len(id) > MaxIDLength || !Printable(id) {
				return fmt.Errorf("%w: id %q", ErrInvalidRecord, truncate(id))
			}
		}
		if len(e.Payload) > 0 && (!utf8.Valid(e.Payload) || !json.Valid(e.Payload)) {
			return fmt.Errorf("%w: entry %s payload is not JSON", ErrInvalidRecord, e.Type)
		}
	case KindTruncated:
		if len(r.RewoundTo) > MaxIDLength || len(r.NewLeafID) > MaxIDLength || len(r.Reason) > MaxReasonLength {
			return fmt.Errorf("%w: truncation fields too long", ErrInvalidRecord)
		}
		if !Printable(r.RewoundTo) || !Printable(r.NewLeafID) || !utf8.ValidString(r.Reason) {
			return fmt.Errorf("%w: truncation fields must be UTF-8 text", ErrInvalidRecord)
		}
	default:
		return fmt.Errorf("%w: record kind %q", ErrInvalidRecord, truncate(r.Kind))
	}
	return nil
}

// Printable accepts valid UTF-8 without control characters. Anything else
// would be rewritten by the JSON encoder, so that what is stored differs
// from what was accepted.
func Printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
