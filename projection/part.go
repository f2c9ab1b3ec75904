package projection

import (
	"bytes"
	"encoding/json"

	"github.com/convlog/convlog/log/record"
)

// Part types of a projected message. Text, reasoning, file and data keep
// their payload names (record.PartText, record.PartReasoning, record.PartFile,
// record.PartData); a payload's tool-call becomes a tool part, because the
// projected part covers the whole call, result included.
const PartTool = "tool"

// States of a tool part.
const (
	StateInputAvailable  = "input-available"
	StateOutputAvailable = "output-available"
	StateOutputError     = "output-error"
)

// Part is one piece of a projected message. Which fields are set depends on
// Type: text and reasoning carry Text; tool carries ToolCallID, ToolName,
// State and Input, plus Output once a result arrived and ErrorText when that
// result is an error; file carries MediaType, URL and Filename; data carries
// Name and Data.
//
// The JSON form holds exactly the fields of the part's type, each present
// even when empty, so that clients can rely on the shape per type.
type Part struct {
	Type       string          `json:"type"`
	Text       string          `json:"text,omitempty"`
	ToolCallID string          `json:"toolCallId,omitempty"`
	ToolName   string          `json:"toolName,omitempty"`
	State      string          `json:"state,omitempty"`
	Input      json.RawMessage `json:"input,omitempty"`
	Output     json.RawMessage `json:"output,omitempty"`
	ErrorText  string          `json:"errorText,omitempty"`
	MediaType  string          `json:"mediaType,omitempty"`
	URL        string          `json:"url,omitempty"`
	Filename   string          `json:"filename,omitempty"`
	Name       string          `json:"name,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
}

func partFromPayload(p record.Part) (Part, bool) {
	switch p.Type {
	case record.PartText, record.PartReasoning:
		return Part{Type: p.Type, Text: p.Text}, true
	case record.PartToolCall:
		return Part{Type: PartTool, ToolCallID: p.ToolCallID, ToolName: p.ToolName, State: StateInputAvailable, Input: p.Input}, true
	case record.PartFile:
		return Part{Type: record.PartFile, MediaType: p.MediaType, URL: p.URL, Filename: p.Filename}, true
	case record.PartData:
		return Part{Type: record.PartData, Name: p.Name, Data: p.Data}, true
	}
	return Part{}, false
}

// withResult is the tool part p once result r has arrived. The raw output is
// kept on errors too: errorText is for people, the output may be for code.
func (p Part) withResult(r *record.ToolResultPayload) Part {
	p.Output = r.Output
	if p.ToolName == "" {
		p.ToolName = r.ToolName
	}
	if r.IsError {
		p.State, p.ErrorText = StateOutputError, errorText(r.Output)
	} else {
		p.State, p.ErrorText = StateOutputAvailable, ""
	}
	return p
}

// errorText is the message of a failed tool call: the output itself when it
// is a JSON string (the common case), else the output's JSON text.
func errorText(output json.RawMessage) string {
	if len(output) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(output, &s) == nil {
		return s
	}
	var b bytes.Buffer
	if json.Compact(&b, output) != nil {
		return string(output)
	}
	return b.String()
}

func (p Part) clone() Part {
	p.Input = bytes.Clone(p.Input)
	p.Output = bytes.Clone(p.Output)
	p.Data = bytes.Clone(p.Data)
	return p
}

// MarshalJSON writes the fields of the part's type and no others.
func (p Part) MarshalJSON() ([]byte, error) {
	switch p.Type {
	case record.PartText, record.PartReasoning:
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{p.Type, p.Text})
	case PartTool:
		t := struct {
			Type       string          `json:"type"`
			ToolCallID string          `json:"toolCallId"`
			ToolName   string          `json:"toolName"`
			State      string          `json:"state"`
			Input      json.RawMessage `json:"input"`
			Output     json.RawMessage `json:"output,omitempty"`
			ErrorText  *string         `json:"errorText,omitempty"`
		}{Type: p.Type, ToolCallID: p.ToolCallID, ToolName: p.ToolName, State: p.State, Input: nullIfEmpty(p.Input)}
		switch p.State {
		case StateOutputAvailable:
			t.Output = nullIfEmpty(p.Output)
		case StateOutputError:
			t.Output = p.Output
			t.ErrorText = &p.ErrorText
		}
		return json.Marshal(t)
	case record.PartFile:
		return json.Marshal(struct {
			Type      string `json:"type"`
			MediaType string `json:"mediaType"`
			URL       string `json:"url"`
			Filename  string `json:"filename,omitempty"`
		}{p.Type, p.MediaType, p.URL, p.Filename})
	case record.PartData:
		return json.Marshal(struct {
			Type string          `json:"type"`
			Name string          `json:"name"`
			Data json.RawMessage `json:"data"`
		}{p.Type, p.Name, nullIfEmpty(p.Data)})
	}
	// Not a type the projection makes; write whatever is set.
	type plain Part
	return json.Marshal(plain(p))
}

func nullIfEmpty(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}
