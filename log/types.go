package log

import (
	"github.com/oklog/ulid/v2"

	"github.com/convlog/convlog/log/record"
)

// The record types the log stores are package record's (light, with no
// storage engine); these names keep the log's API whole.
//
//go:fix inline
type (
	Record            = record.Record
	Entry             = record.Entry
	Batch             = record.Batch
	RawRecords        = record.RawRecords
	Key               = record.Key
	Offset            = record.Offset
	Incarnation       = record.Incarnation
	ReadResult        = record.ReadResult
	Status            = record.Status
	Submission        = record.Submission
	MessagePayload    = record.MessagePayload
	Part              = record.Part
	ToolResultPayload = record.ToolResultPayload
	Outcome           = record.Outcome
	Settlement        = record.Settlement
	Failure           = record.Failure
)

// Record kinds, entry types, limits, purposes, display modes, part types,
// outcomes and statuses: see package record.
//
//go:fix inline
const (
	KindEntry     = record.KindEntry
	KindTruncated = record.KindTruncated

	EntryUserMessage      = record.EntryUserMessage
	EntryAssistantMessage = record.EntryAssistantMessage
	EntryToolResult       = record.EntryToolResult
	EntrySettlement       = record.EntrySettlement

	MaxIDLength     = record.MaxIDLength
	MaxTypeLength   = record.MaxTypeLength
	MaxReasonLength = record.MaxReasonLength
	MaxRecordsBatch = record.MaxRecordsBatch
	MaxBatchBytes   = record.MaxBatchBytes
	MaxNameLength   = record.MaxNameLength

	PurposeUser      = record.PurposeUser
	PurposeAssistant = record.PurposeAssistant
	PurposeDispatch  = record.PurposeDispatch
	PurposeAdvisory  = record.PurposeAdvisory

	DisplayVisible    = record.DisplayVisible
	DisplayHidden     = record.DisplayHidden
	DisplayDiagnostic = record.DisplayDiagnostic

	PartText      = record.PartText
	PartReasoning = record.PartReasoning
	PartToolCall  = record.PartToolCall
	PartFile      = record.PartFile
	PartData      = record.PartData

	OutcomeCompleted = record.OutcomeCompleted
	OutcomeFailed    = record.OutcomeFailed
	OutcomeAborted   = record.OutcomeAborted

	StatusAdmitted  = record.StatusAdmitted
	StatusRunning   = record.StatusRunning
	StatusCompleted = record.StatusCompleted
	StatusFailed    = record.StatusFailed
	StatusAborted   = record.StatusAborted

	// Start is the offset of a stream's first batch.
	Start = record.Start
	// DefaultSession is the session of a delivery that names none.
	DefaultSession = record.DefaultSession
)

// EntryRecord wraps an entry in a record.
//
//go:fix inline
func EntryRecord(e Entry) Record { return record.EntryRecord(e) }

// TruncatedRecord makes a truncation back to rewoundTo.
//
//go:fix inline
func TruncatedRecord(rewoundTo, reason string) Record {
	return record.TruncatedRecord(rewoundTo, reason)
}

// ParseOffset checks the form of an offset from outside.
//
//go:fix inline
func ParseOffset(s string) (Offset, error) { return record.ParseOffset(s) }

// ParseIncarnation checks the form of an incarnation from outside.
//
//go:fix inline
func ParseIncarnation(s string) (Incarnation, error) { return record.ParseIncarnation(s) }

// ValidateName checks one agent, instance or session name.
//
//go:fix inline
func ValidateName(name string) error { return record.ValidateName(name) }

//go:fix inline
func offsetOf(pos uint64) Offset { return record.OffsetOf(pos) }

func incarnationOf(id ulid.ULID) Incarnation {
	return Incarnation(record.IncarnationPrefix + id.String())
}

// printable accepts valid UTF-8 without control characters: anything else
// would be rewritten by the JSON encoder.
//
//go:fix inline
func printable(s string) bool { return record.Printable(s) }
