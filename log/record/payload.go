package record

import "encoding/json"

// Message purposes and display modes, as the projection reports them.
const (
	PurposeUser      = "user"
	PurposeAssistant = "assistant"
	PurposeDispatch  = "dispatch"
	PurposeAdvisory  = "advisory"

	DisplayVisible    = "visible"
	DisplayHidden     = "hidden"
	DisplayDiagnostic = "diagnostic"
)

// Part types of a message payload.
const (
	PartText      = "text"
	PartReasoning = "reasoning"
	PartToolCall  = "tool-call"
	PartFile      = "file"
	PartData      = "data"
)

// MessagePayload is the payload of user_message and assistant_message entries.
type MessagePayload struct {
	Purpose  string          `json:"purpose,omitempty"`
	Display  string          `json:"display,omitempty"`
	Parts    []Part          `json:"parts"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// Part is one piece of a message. Which fields are set depends on Type:
// text and reasoning carry Text; tool-call carries ToolCallID, ToolName and
// Input; file carries MediaType, URL (a data: URL for inline bytes) and
// Filename; data carries Name and Data.
type Part struct {
	Type       string          `json:"type"`
	Text       string          `json:"text,omitempty"`
	ToolCallID string          `json:"toolCallId,omitempty"`
	ToolName   string          `json:"toolName,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
	MediaType  string          `json:"mediaType,omitempty"`
	URL        string          `json:"url,omitempty"`
	Filename   string          `json:"filename,omitempty"`
	Name       string          `json:"name,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
}

// ToolResultPayload is the payload of a tool_result entry: the end of the
// tool call ToolCallID of an earlier assistant message.
type ToolResultPayload struct {
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName,omitempty"`
	IsError    bool            `json:"isError"`
	Output     json.RawMessage `json:"output,omitempty"`
}

// Outcome is how a submission ended.
type Outcome string

// Terminal outcomes.
const (
	OutcomeCompleted Outcome = "completed"
	OutcomeFailed    Outcome = "failed"
	OutcomeAborted   Outcome = "aborted"
)

// Valid reports whether o is one of the terminal outcomes.
func (o Outcome) Valid() bool {
	return o == OutcomeCompleted || o == OutcomeFailed || o == OutcomeAborted
}

// Settlement is the payload of a settlement entry, the terminal fact about
// one submission.
type Settlement struct {
	SubmissionID           string   `json:"submissionId"`
	Outcome                Outcome  `json:"outcome"`
	Error                  *Failure `json:"error,omitempty"`
	AnsweredBySubmissionID string   `json:"answeredBySubmissionId,omitempty"`
}

// Failure describes why a submission failed or was aborted.
type Failure struct {
	Code      string `json:"code,omitempty"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

// ApprovalRequestPayload is the payload of an approval_request entry.
type ApprovalRequestPayload struct {
	Requests []ApprovalRequest `json:"requests"`
}

// ApprovalDecisionPayload is the payload of an approval_decision entry:
// the decision on one request. Input, the edited arguments, goes with an
// approval only. Principal is who decided; nil with authentication off.
type ApprovalDecisionPayload struct {
	ApprovalID string          `json:"approvalId"`
	Approved   bool            `json:"approved"`
	Reason     string          `json:"reason,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
	Principal  *Principal      `json:"principal,omitempty"`
}

// Principal names who made a decision.
type Principal struct {
	Issuer  string `json:"issuer,omitempty"`
	Subject string `json:"subject"`
}

// ReasonTimeout is the reason of a denial by the approval timeout.
const ReasonTimeout = "timeout"
