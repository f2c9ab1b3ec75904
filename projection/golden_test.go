package projection_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current projection")

// goldenConversations are the views whose JSON is pinned: the wire shape is
// a protocol clients build against, so any change to it must show up as a
// diff in review.
var goldenConversations = map[string][]record.Record{
	"chat": {
		withSub(entry("01J0U1", "", record.EntryUserMessage, record.MessagePayload{
			Parts: []record.Part{
				text("What is in this picture?"),
				{Type: record.PartFile, MediaType: "image/png", URL: "data:image/png;base64,iVBORw0KGgo=", Filename: "cat.png"},
			},
			Metadata: json.RawMessage(`{"client":"web"}`),
		}), "sub_1", ""),
		withSub(assistant("01J0A1", "01J0U1",
			record.Part{Type: record.PartReasoning, Text: "The image shows an animal."},
			text("A cat sitting on a windowsill."),
			record.Part{Type: record.PartData, Name: "confidence", Data: json.RawMessage(`{"score":0.93}`)},
		), "sub_1", "turn_1"),
		withSub(settlement("01J0S1", "01J0A1", record.Settlement{SubmissionID: "sub_1", Outcome: record.OutcomeCompleted}), "sub_1", ""),
	},
	"tools": {
		withSub(user("01J1U1", "", text("Find open issues and summarize them.")), "sub_1", ""),
		withSub(assistant("01J1A1", "01J1U1",
			text("Let me look."),
			toolCall("call_1", "list_issues", `{"state":"open"}`),
			toolCall("call_2", "fetch_labels", `{}`),
		), "sub_1", "turn_1"),
		withSub(toolResult("01J1R1", "01J1A1", "call_1", false, `[{"id":7,"title":"Crash on save"}]`), "sub_1", "turn_1"),
		withSub(toolResult("01J1R2", "01J1R1", "call_2", true, `"labels service unavailable"`), "sub_1", "turn_1"),
		withSub(toolResult("01J1R3", "01J1R2", "call_404", false, `"orphan"`), "sub_1", "turn_1"),
		withSub(entry("01J1D1", "01J1R3", record.EntryUserMessage, record.MessagePayload{
			Purpose: record.PurposeDispatch, Display: record.DisplayHidden,
			Parts: []record.Part{text("[ci] build 42 failed")},
		}), "sub_2", ""),
		withSub(entry("01J1V1", "01J1D1", record.EntryAssistantMessage, record.MessagePayload{
			Purpose: record.PurposeAdvisory, Display: record.DisplayDiagnostic,
			Parts: []record.Part{text("retrying with a smaller page size")},
		}), "sub_1", "turn_1"),
		withSub(assistant("01J1A2", "01J1V1", text("One open issue: #7, a crash on save.")), "sub_1", "turn_1"),
		entry("01J1C1", "01J1A2", "custom_audit", `{"who":"bot"}`),
		withSub(settlement("01J1S1", "01J1C1", record.Settlement{SubmissionID: "sub_2", Outcome: record.OutcomeCompleted, AnsweredBySubmissionID: "sub_1"}), "sub_2", ""),
		withSub(settlement("01J1S2", "01J1S1", record.Settlement{SubmissionID: "sub_1", Outcome: record.OutcomeFailed, Error: &record.Failure{Code: "tool_error", Message: "labels service unavailable", Retryable: true}}), "sub_1", ""),
		withSub(settlement("01J1S3", "01J1S2", record.Settlement{SubmissionID: "sub_1", Outcome: record.OutcomeCompleted}), "sub_1", ""),
	},
	"branched": {
		withSub(user("01J2U1", "", text("Write a haiku about rain.")), "sub_1", ""),
		withSub(assistant("01J2A1", "01J2U1", text("Grey clouds gather slow")), "sub_1", "turn_1"),
		withSub(settlement("01J2S1", "01J2A1", record.Settlement{SubmissionID: "sub_1", Outcome: record.OutcomeCompleted}), "sub_1", ""),
		// Regenerate: the first answer leaves the path, its settlement stays.
		truncated("01J2U1"),
		withSub(assistant("01J2A2", "01J2U1", text("Soft rain on the roof")), "sub_2", "turn_2"),
		withSub(settlement("01J2S2", "01J2A2", record.Settlement{SubmissionID: "sub_2", Outcome: record.OutcomeAborted, Error: &record.Failure{Code: "cancelled", Message: "stopped by user"}}), "sub_2", ""),
		// Edit the question: an implicit branch from the start.
		withSub(user("01J2U2", "", text("Write a haiku about snow.")), "sub_3", ""),
		withSub(assistant("01J2A3", "01J2U2", toolCall("call_1", "thesaurus", `{"word":"snow"}`)), "sub_3", "turn_3"),
		withSub(toolResult("01J2R1", "01J2A3", "call_1", false, `["powder","flurry"]`), "sub_3", "turn_3"),
		withSub(assistant("01J2A4", "01J2R1", text("Powder on the pines")), "sub_3", "turn_3"),
	},
}

func TestGolden(t *testing.T) {
	for name, records := range goldenConversations {
		t.Run(name, func(t *testing.T) {
			got, err := json.MarshalIndent(projection.Project(records), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("view of %s differs from %s (run with -update if the change is intended):\n%s", name, path, got)
			}
		})
	}
}
