package projection_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
	"pgregory.net/rapid"
)

// genConversation draws a record sequence shaped like what the engine
// stores: entries whose parent is the leaf, with branches from earlier
// entries, truncations, and everything the projection must skip. Every
// parent is a known entry or the start, so ActivePath is a full account of
// the path.
func genConversation(t *rapid.T) []record.Record {
	var (
		records []record.Record
		parents = map[string]string{}
		ids     []string
		leaf    string
	)
	path := func() []string {
		var p []string
		for id := leaf; id != ""; id = parents[id] {
			p = append([]string{id}, p...)
		}
		return p
	}
	// pick is "" (the start) or an entry of ids.
	pick := func(ids []string, label string) string {
		i := rapid.IntRange(-1, len(ids)-1).Draw(t, label)
		if i < 0 {
			return ""
		}
		return ids[i]
	}
	add := func(typ string, payload json.RawMessage) {
		id := fmt.Sprintf("e%d", len(ids))
		parent := leaf
		switch rapid.IntRange(0, 9).Draw(t, "parentChoice") {
		case 0:
			parent = pick(path(), "pathParent")
		case 1:
			parent = pick(ids, "anyParent")
		}
		e := record.Entry{ID: id, ParentID: parent, Type: typ, Payload: payload}
		if rapid.Bool().Draw(t, "hasSubmission") {
			e.SubmissionID = fmt.Sprintf("s%d", rapid.IntRange(0, 3).Draw(t, "entrySubmission"))
		}
		records = append(records, record.EntryRecord(e))
		parents[id] = parent
		ids = append(ids, id)
		leaf = id
	}
	callID := func(label string) string { return fmt.Sprintf("c%d", rapid.IntRange(0, 6).Draw(t, label)) }
	message := func() record.MessagePayload {
		var p record.MessagePayload
		p.Purpose = rapid.SampledFrom([]string{"", record.PurposeUser, record.PurposeAssistant, record.PurposeDispatch, record.PurposeAdvisory}).Draw(t, "purpose")
		p.Display = rapid.SampledFrom([]string{"", record.DisplayVisible, record.DisplayHidden, record.DisplayDiagnostic}).Draw(t, "display")
		for range rapid.IntRange(0, 3).Draw(t, "parts") {
			switch typ := rapid.SampledFrom([]string{record.PartText, record.PartReasoning, record.PartToolCall, record.PartToolCall, record.PartFile, record.PartData, "sparkle"}).Draw(t, "partType"); typ {
			case record.PartToolCall:
				p.Parts = append(p.Parts, record.Part{Type: typ, ToolCallID: callID("callId"), ToolName: "tool", Input: json.RawMessage(`{"n":1}`)})
			case record.PartFile:
				p.Parts = append(p.Parts, record.Part{Type: typ, MediaType: "text/plain", URL: "data:,x"})
			case record.PartData:
				p.Parts = append(p.Parts, record.Part{Type: typ, Name: "d", Data: json.RawMessage(`[1]`)})
			default:
				p.Parts = append(p.Parts, record.Part{Type: typ, Text: rapid.StringMatching(`[a-z]{0,4}`).Draw(t, "text")})
			}
		}
		return p
	}
	for range rapid.IntRange(0, 60).Draw(t, "records") {
		switch rapid.IntRange(0, 11).Draw(t, "op") {
		case 0, 1, 2:
			add(record.EntryUserMessage, mustJSON(message()))
		case 3, 4, 5:
			add(record.EntryAssistantMessage, mustJSON(message()))
		case 6, 7:
			output := rapid.SampledFrom([]string{``, `null`, `"failed"`, `{"x":1}`, `[1,2]`}).Draw(t, "output")
			add(record.EntryToolResult, mustJSON(record.ToolResultPayload{ToolCallID: callID("resultCallId"), IsError: rapid.Bool().Draw(t, "isError"), Output: json.RawMessage(output)}))
		case 8:
			s := record.Settlement{
				SubmissionID: fmt.Sprintf("s%d", rapid.IntRange(0, 3).Draw(t, "submission")),
				Outcome:      rapid.SampledFrom([]record.Outcome{record.OutcomeCompleted, record.OutcomeFailed, record.OutcomeAborted}).Draw(t, "outcome"),
			}
			if s.Outcome != record.OutcomeCompleted {
				s.Error = &record.Failure{Message: rapid.StringMatching(`[a-z]{1,4}`).Draw(t, "failure")}
			}
			add(record.EntrySettlement, mustJSON(s))
		case 9:
			typ := rapid.SampledFrom([]string{"custom_note", record.EntryUserMessage, record.EntryToolResult, record.EntrySettlement}).Draw(t, "oddType")
			payload := rapid.SampledFrom([]string{`{"custom":true}`, `[1]`, `"x"`, `{"parts":"no"}`}).Draw(t, "oddPayload")
			add(typ, json.RawMessage(payload))
		case 10:
			records = append(records, record.Record{Kind: rapid.SampledFrom([]string{"checkpoint", "", "Entry"}).Draw(t, "oddKind")})
		case 11:
			var to string
			switch rapid.IntRange(0, 3).Draw(t, "truncation") {
			case 0, 1:
				to = pick(path(), "rewindOnPath")
			case 2:
				to = pick(ids, "rewindAnywhere")
			case 3:
				to = "never-seen"
			}
			r := record.TruncatedRecord(to, "test")
			if rapid.IntRange(0, 4).Draw(t, "moveLeaf") == 0 {
				r.NewLeafID = pick(ids, "newLeaf")
			}
			records = append(records, r)
			target := r.NewLeafID
			if target == "" {
				target = to
			}
			if _, known := parents[target]; known || target == "" {
				leaf = target
			}
		}
	}
	return records
}

func TestProjectorProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		records := genConversation(t)
		all := projection.Project(records)

		// Incremental: any split into batches gives Project of the prefix.
		p := projection.NewProjector()
		var early projection.View
		var earlyJSON string
		for k := 0; k < len(records); {
			n := rapid.IntRange(1, 8).Draw(t, "batch")
			n = min(n, len(records)-k)
			p.Apply(records[k : k+n]...)
			k += n
			got, want := p.View(), projection.Project(records[:k])
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("after %d records:\nincremental %s\n    project %s", k, jsonOf(t, got), jsonOf(t, want))
			}
			if earlyJSON == "" {
				early, earlyJSON = got, jsonOf(t, got)
			}
		}
		if got := p.View(); !reflect.DeepEqual(got, all) {
			t.Fatalf("final incremental view differs from Project")
		}
		if earlyJSON != "" && jsonOf(t, early) != earlyJSON {
			t.Fatalf("a view changed after later Apply calls:\n was %s\n now %s", earlyJSON, jsonOf(t, early))
		}

		// The messages are those of the active path alone.
		onPath := projection.Project(entryRecords(projection.ActivePath(records)))
		if !reflect.DeepEqual(all.Messages, onPath.Messages) {
			t.Fatalf("messages differ from the active path's:\n all %s\npath %s", jsonOf(t, all.Messages), jsonOf(t, onPath.Messages))
		}

		// Settlements: one per submission, the first seen.
		first := map[string]record.Settlement{}
		var order []string
		for _, r := range records {
			if r.Kind != record.KindEntry || r.Entry.Type != record.EntrySettlement {
				continue
			}
			var s record.Settlement
			if json.Unmarshal(r.Entry.Payload, &s) != nil || s.SubmissionID == "" {
				continue
			}
			if _, ok := first[s.SubmissionID]; !ok {
				first[s.SubmissionID] = s
				order = append(order, s.SubmissionID)
			}
		}
		want := []record.Settlement{}
		for _, id := range order {
			want = append(want, first[id])
		}
		if !reflect.DeepEqual(all.Settlements, want) {
			t.Fatalf("settlements %s, want %s", jsonOf(t, all.Settlements), jsonOf(t, want))
		}
	})
}
