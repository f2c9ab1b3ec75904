package projection_test

import (
	"encoding/json"
	"time"

	"github.com/convlog/convlog/log"
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

func entry(id, parent, typ string, payload any) log.Record {
	var raw json.RawMessage
	switch p := payload.(type) {
	case string:
		raw = json.RawMessage(p)
	default:
		raw = mustJSON(p)
	}
	return log.EntryRecord(log.Entry{ID: id, ParentID: parent, Timestamp: t0, Type: typ, Payload: raw})
}

func withSub(r log.Record, submission, turn string) log.Record {
	r.Entry.SubmissionID, r.Entry.TurnID = submission, turn
	return r
}

func user(id, parent string, parts ...log.Part) log.Record {
	return entry(id, parent, log.EntryUserMessage, log.MessagePayload{Parts: parts})
}

func assistant(id, parent string, parts ...log.Part) log.Record {
	return entry(id, parent, log.EntryAssistantMessage, log.MessagePayload{Parts: parts})
}

func toolResult(id, parent, callID string, isError bool, output string) log.Record {
	return entry(id, parent, log.EntryToolResult, log.ToolResultPayload{ToolCallID: callID, IsError: isError, Output: json.RawMessage(output)})
}

func settlement(id, parent string, s log.Settlement) log.Record {
	return entry(id, parent, log.EntrySettlement, s)
}

func text(s string) log.Part { return log.Part{Type: log.PartText, Text: s} }

func toolCall(id, name, input string) log.Part {
	return log.Part{Type: log.PartToolCall, ToolCallID: id, ToolName: name, Input: json.RawMessage(input)}
}

func truncated(rewoundTo string) log.Record { return log.TruncatedRecord(rewoundTo, "test") }

func entryRecords(entries []log.Entry) []log.Record {
	out := make([]log.Record, len(entries))
	for i, e := range entries {
		out[i] = log.EntryRecord(e)
	}
	return out
}
