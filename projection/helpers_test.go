package projection_test

import (
	"encoding/json"
	"time"

	"github.com/convlog/convlog/log/record"
)

// Builders for records as the engine stores them. Timestamps do not reach the
// view, so one fixed instant keeps golden files stable.
var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func entry(id, parent, typ string, payload any) record.Record {
	var raw json.RawMessage
	switch p := payload.(type) {
	case string:
		raw = json.RawMessage(p)
	default:
		raw = mustJSON(p)
	}
	return record.EntryRecord(record.Entry{ID: id, ParentID: parent, Timestamp: t0, Type: typ, Payload: raw})
}

func withSub(r record.Record, submission, turn string) record.Record {
	r.Entry.SubmissionID, r.Entry.TurnID = submission, turn
	return r
}

func user(id, parent string, parts ...record.Part) record.Record {
	return entry(id, parent, record.EntryUserMessage, record.MessagePayload{Parts: parts})
}

func assistant(id, parent string, parts ...record.Part) record.Record {
	return entry(id, parent, record.EntryAssistantMessage, record.MessagePayload{Parts: parts})
}

func toolResult(id, parent, callID string, isError bool, output string) record.Record {
	return entry(id, parent, record.EntryToolResult, record.ToolResultPayload{ToolCallID: callID, IsError: isError, Output: json.RawMessage(output)})
}

func settlement(id, parent string, s record.Settlement) record.Record {
	return entry(id, parent, record.EntrySettlement, s)
}

func text(s string) record.Part { return record.Part{Type: record.PartText, Text: s} }

func toolCall(id, name, input string) record.Part {
	return record.Part{Type: record.PartToolCall, ToolCallID: id, ToolName: name, Input: json.RawMessage(input)}
}

func truncated(rewoundTo string) record.Record { return record.TruncatedRecord(rewoundTo, "test") }

func entryRecords(entries []record.Entry) []record.Record {
	out := make([]record.Record, len(entries))
	for i, e := range entries {
		out[i] = record.EntryRecord(e)
	}
	return out
}
