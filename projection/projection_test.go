package projection_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
)

// Builders for expected views.
func msg(id, role string, parts ...projection.Part) projection.Message {
	purpose := record.PurposeUser
	if role == projection.RoleAssistant {
		purpose = record.PurposeAssistant
	}
	if parts == nil {
		parts = []projection.Part{}
	}
	return projection.Message{ID: id, Role: role, Purpose: purpose, Display: record.DisplayVisible, Parts: parts}
}

func pText(s string) projection.Part { return projection.Part{Type: record.PartText, Text: s} }

func pTool(id, name, input string) projection.Part {
	return projection.Part{Type: projection.PartTool, ToolCallID: id, ToolName: name, State: projection.StateInputAvailable, Input: json.RawMessage(input)}
}

func pDone(p projection.Part, output string) projection.Part {
	p.State, p.Output = projection.StateOutputAvailable, json.RawMessage(output)
	return p
}

func pFailed(p projection.Part, output, errorText string) projection.Part {
	p.State, p.Output, p.ErrorText = projection.StateOutputError, json.RawMessage(output), errorText
	return p
}

func view(msgs ...projection.Message) projection.View {
	if msgs == nil {
		msgs = []projection.Message{}
	}
	return projection.View{Messages: msgs, Settlements: []record.Settlement{}}
}

func (c ruleCase) withSettlements(s ...record.Settlement) ruleCase {
	c.want.Settlements = s
	return c
}

type ruleCase struct {
	name    string
	records []record.Record
	want    projection.View
}

func TestProjectRules(t *testing.T) {
	call := pTool("c1", "search", `{"q":"x"}`)
	done := record.Settlement{SubmissionID: "s1", Outcome: record.OutcomeCompleted}
	failed := record.Settlement{SubmissionID: "s1", Outcome: record.OutcomeFailed, Error: &record.Failure{Message: "boom"}}

	cases := []ruleCase{
		{name: "empty", want: view()},
		{
			name:    "user message",
			records: []record.Record{user("u1", "", text("hi"))},
			want:    view(msg("u1", projection.RoleUser, pText("hi"))),
		},
		{
			name: "assistant message with reasoning",
			records: []record.Record{
				user("u1", "", text("hi")),
				assistant("a1", "u1", record.Part{Type: record.PartReasoning, Text: "think"}, text("hello")),
			},
			want: view(
				msg("u1", projection.RoleUser, pText("hi")),
				msg("a1", projection.RoleAssistant, projection.Part{Type: record.PartReasoning, Text: "think"}, pText("hello")),
			),
		},
		{
			name: "purpose and display from payload",
			records: []record.Record{
				entry("u1", "", record.EntryUserMessage, record.MessagePayload{Purpose: record.PurposeDispatch, Display: record.DisplayHidden, Parts: []record.Part{text("sig")}}),
				entry("a1", "u1", record.EntryAssistantMessage, record.MessagePayload{Purpose: record.PurposeAdvisory, Display: record.DisplayDiagnostic}),
			},
			want: view(
				projection.Message{ID: "u1", Role: projection.RoleUser, Purpose: record.PurposeDispatch, Display: record.DisplayHidden, Parts: []projection.Part{pText("sig")}},
				projection.Message{ID: "a1", Role: projection.RoleAssistant, Purpose: record.PurposeAdvisory, Display: record.DisplayDiagnostic, Parts: []projection.Part{}},
			),
		},
		{
			name: "submission, turn and metadata",
			records: []record.Record{
				withSub(entry("u1", "", record.EntryUserMessage, `{"parts":[],"metadata":{"k":1}}`), "s1", "t1"),
				withSub(entry("a1", "u1", record.EntryAssistantMessage, `{"parts":null,"metadata":null}`), "s1", "t1"),
			},
			want: view(
				projection.Message{ID: "u1", Role: projection.RoleUser, Purpose: record.PurposeUser, Display: record.DisplayVisible, SubmissionID: "s1", TurnID: "t1", Metadata: json.RawMessage(`{"k":1}`), Parts: []projection.Part{}},
				projection.Message{ID: "a1", Role: projection.RoleAssistant, Purpose: record.PurposeAssistant, Display: record.DisplayVisible, SubmissionID: "s1", TurnID: "t1", Parts: []projection.Part{}},
			),
		},
		{
			name: "file and data parts",
			records: []record.Record{user("u1", "",
				record.Part{Type: record.PartFile, MediaType: "image/png", URL: "data:image/png;base64,AA==", Filename: "a.png"},
				record.Part{Type: record.PartData, Name: "weather", Data: json.RawMessage(`{"t":20}`)},
			)},
			want: view(msg("u1", projection.RoleUser,
				projection.Part{Type: record.PartFile, MediaType: "image/png", URL: "data:image/png;base64,AA==", Filename: "a.png"},
				projection.Part{Type: record.PartData, Name: "weather", Data: json.RawMessage(`{"t":20}`)},
			)),
		},
		{
			name:    "tool call",
			records: []record.Record{assistant("a1", "", toolCall("c1", "search", `{"q":"x"}`))},
			want:    view(msg("a1", projection.RoleAssistant, call)),
		},
		{
			name: "tool result",
			records: []record.Record{
				assistant("a1", "", toolCall("c1", "search", `{"q":"x"}`)),
				toolResult("r1", "a1", "c1", false, `{"hits":3}`),
			},
			want: view(msg("a1", projection.RoleAssistant, pDone(call, `{"hits":3}`))),
		},
		{
			name: "tool error with string output",
			records: []record.Record{
				assistant("a1", "", toolCall("c1", "search", `{"q":"x"}`)),
				toolResult("r1", "a1", "c1", true, `"no network"`),
			},
			want: view(msg("a1", projection.RoleAssistant, pFailed(call, `"no network"`, "no network"))),
		},
		{
			name: "tool error with object output",
			records: []record.Record{
				assistant("a1", "", toolCall("c1", "search", `{"q":"x"}`)),
				entry("r1", "a1", record.EntryToolResult, `{"toolCallId":"c1","isError":true,"output":{ "code": 7 }}`),
			},
			want: view(msg("a1", projection.RoleAssistant, pFailed(call, `{ "code": 7 }`, `{"code":7}`))),
		},
		{
			name: "tool name from result when call has none",
			records: []record.Record{
				assistant("a1", "", toolCall("c1", "", `{}`)),
				entry("r1", "a1", record.EntryToolResult, record.ToolResultPayload{ToolCallID: "c1", ToolName: "search", Output: json.RawMessage(`1`)}),
			},
			want: view(msg("a1", projection.RoleAssistant, pDone(pTool("c1", "search", `{}`), `1`))),
		},
		{
			name: "orphan tool result",
			records: []record.Record{
				assistant("a1", "", toolCall("c1", "search", `{"q":"x"}`)),
				toolResult("r1", "a1", "c9", false, `1`),
			},
			want: view(msg("a1", projection.RoleAssistant, call)),
		},
		{
			name: "result goes to the most recent call with its id",
			records: []record.Record{
				assistant("a1", "", toolCall("c1", "search", `{"q":"x"}`)),
				assistant("a2", "a1", toolCall("c1", "search", `{"q":"x"}`)),
				toolResult("r1", "a2", "c1", false, `1`),
			},
			want: view(msg("a1", projection.RoleAssistant, call), msg("a2", projection.RoleAssistant, pDone(call, `1`))),
		},
		{
			name: "truncation undoes a tool result",
			records: []record.Record{
				assistant("a1", "", toolCall("c1", "search", `{"q":"x"}`)),
				toolResult("r1", "a1", "c1", false, `1`),
				truncated("a1"),
			},
			want: view(msg("a1", projection.RoleAssistant, call)),
		},
		{
			name: "result for a call truncated away",
			records: []record.Record{
				user("u1", ""),
				assistant("a1", "u1", toolCall("c1", "search", `{"q":"x"}`)),
				truncated("u1"),
				toolResult("r1", "u1", "c1", false, `1`),
			},
			want: view(msg("u1", projection.RoleUser)),
		},
		{
			name: "truncation to the middle",
			records: []record.Record{
				user("u1", "", text("1")), assistant("a1", "u1", text("2")), user("u2", "a1", text("3")), assistant("a2", "u2", text("4")),
				truncated("a1"),
				user("u3", "a1", text("5")),
			},
			want: view(msg("u1", projection.RoleUser, pText("1")), msg("a1", projection.RoleAssistant, pText("2")), msg("u3", projection.RoleUser, pText("5"))),
		},
		{
			name: "truncation to the start",
			records: []record.Record{
				user("u1", "", text("1")), assistant("a1", "u1", text("2")),
				truncated(""),
				user("u2", "", text("3")),
			},
			want: view(msg("u2", projection.RoleUser, pText("3"))),
		},
		{
			name: "truncation to an entry never seen",
			records: []record.Record{
				user("u1", "", text("1")),
				truncated("nope"),
			},
			want: view(msg("u1", projection.RoleUser, pText("1"))),
		},
		{
			name: "implicit branch from an earlier entry",
			records: []record.Record{
				user("u1", "", text("1")), assistant("a1", "u1", text("2")), user("u2", "a1", text("3")),
				user("u3", "u1", text("edit")),
			},
			want: view(msg("u1", projection.RoleUser, pText("1")), msg("u3", projection.RoleUser, pText("edit"))),
		},
		{
			name: "implicit branch from the start",
			records: []record.Record{
				user("u1", "", text("1")), assistant("a1", "u1", text("2")),
				user("u2", "", text("again")),
			},
			want: view(msg("u2", projection.RoleUser, pText("again"))),
		},
		{
			name: "parent never seen extends the path",
			records: []record.Record{
				user("u1", "", text("1")),
				assistant("a1", "ghost", text("2")),
				user("u2", "a1", text("3")),
			},
			want: view(msg("u1", projection.RoleUser, pText("1")), msg("a1", projection.RoleAssistant, pText("2")), msg("u2", projection.RoleUser, pText("3"))),
		},
		{
			name: "new leaf on another branch brings that branch back",
			records: []record.Record{
				user("u1", "", text("1")),
				assistant("a1", "u1", toolCall("c1", "search", `{"q":"x"}`)),
				toolResult("r1", "a1", "c1", false, `1`),
				truncated("u1"),
				assistant("a2", "u1", text("other")),
				{Kind: record.KindTruncated, RewoundTo: "u1", NewLeafID: "r1"},
			},
			want: view(msg("u1", projection.RoleUser, pText("1")), msg("a1", projection.RoleAssistant, pDone(call, `1`))),
		},
		{
			name: "parent on a dead branch brings that branch back",
			records: []record.Record{
				user("u1", "", text("1")),
				assistant("a1", "u1", text("first")),
				truncated("u1"),
				assistant("a2", "u1", text("second")),
				user("u2", "a1", text("back")),
			},
			want: view(msg("u1", projection.RoleUser, pText("1")), msg("a1", projection.RoleAssistant, pText("first")), msg("u2", projection.RoleUser, pText("back"))),
		},
		(ruleCase{
			name: "settlement",
			records: []record.Record{
				user("u1", "", text("1")),
				settlement("x1", "u1", done),
			},
			want: view(msg("u1", projection.RoleUser, pText("1"))),
		}).withSettlements(done),
		(ruleCase{
			name: "first settlement counts",
			records: []record.Record{
				settlement("x1", "", failed),
				settlement("x2", "x1", done),
				settlement("x3", "x2", record.Settlement{SubmissionID: "s2", Outcome: record.OutcomeAborted}),
			},
			want: view(),
		}).withSettlements(failed, record.Settlement{SubmissionID: "s2", Outcome: record.OutcomeAborted}),
		(ruleCase{
			name: "settlements survive truncation",
			records: []record.Record{
				user("u1", "", text("1")),
				settlement("x1", "u1", done),
				truncated(""),
			},
			want: view(),
		}).withSettlements(done),
		(ruleCase{
			name: "settlement takes the entry's submission when its payload has none",
			records: []record.Record{
				withSub(entry("x1", "", record.EntrySettlement, `{"outcome":"completed"}`), "s1", ""),
				entry("x2", "x1", record.EntrySettlement, `{"outcome":"completed"}`),
				entry("x3", "x2", record.EntrySettlement, `{"submissionId":"s3"}`),
			},
			want: view(),
		}).withSettlements(done),
		{
			name: "ignored: unknown kinds, types and parts, bad payloads, bad ids",
			records: []record.Record{
				user("u1", "", text("1"), record.Part{Type: "sparkle", Text: "?"}),
				{Kind: "checkpoint"},
				{Kind: record.KindEntry},
				entry("c1", "u1", "custom_note", `{"anything":true}`),
				entry("b1", "c1", record.EntryAssistantMessage, `[1,2]`),
				entry("b2", "b1", record.EntryToolResult, `"x"`),
				entry("b3", "b2", record.EntrySettlement, `7`),
				entry("", "b3", record.EntryUserMessage, record.MessagePayload{Parts: []record.Part{text("no id")}}),
				entry("u1", "b3", record.EntryUserMessage, record.MessagePayload{Parts: []record.Part{text("dup")}}),
				assistant("a1", "b3", text("2")),
			},
			want: view(msg("u1", projection.RoleUser, pText("1")), msg("a1", projection.RoleAssistant, pText("2"))),
		},
		{
			name: "bad payload entry still carries the path",
			records: []record.Record{
				user("u1", "", text("1")),
				entry("b1", "u1", record.EntryUserMessage, `{"parts":"nope"}`),
				assistant("a1", "b1", text("2")),
				truncated("b1"),
			},
			want: view(msg("u1", projection.RoleUser, pText("1"))),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := projection.Project(c.records)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("Project:\n got %s\nwant %s", jsonOf(t, got), jsonOf(t, c.want))
			}
			p := projection.NewProjector()
			for _, r := range c.records {
				p.Apply(r)
			}
			if inc := p.View(); !reflect.DeepEqual(inc, got) {
				t.Errorf("Projector one record at a time:\n got %s\nwant %s", jsonOf(t, inc), jsonOf(t, got))
			}
		})
	}
}

// fataler is what jsonOf needs of a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func jsonOf(t fataler, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return string(b)
}

func TestEmptyViewJSON(t *testing.T) {
	if got, want := jsonOf(t, projection.Project(nil)), `{"messages":[],"settlements":[]}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestPartJSON(t *testing.T) {
	call := pTool("c1", "search", `{"q":"x"}`)
	cases := []struct {
		name string
		part projection.Part
		want string
	}{
		{"empty text", pText(""), `{"type":"text","text":""}`},
		{"reasoning", projection.Part{Type: record.PartReasoning, Text: "r"}, `{"type":"reasoning","text":"r"}`},
		{"tool input", call, `{"type":"tool","toolCallId":"c1","toolName":"search","state":"input-available","input":{"q":"x"}}`},
		{"tool without input", pTool("c1", "s", ""), `{"type":"tool","toolCallId":"c1","toolName":"s","state":"input-available","input":null}`},
		{"tool output", pDone(call, `[1]`), `{"type":"tool","toolCallId":"c1","toolName":"search","state":"output-available","input":{"q":"x"},"output":[1]}`},
		{"tool output missing", pDone(call, ``), `{"type":"tool","toolCallId":"c1","toolName":"search","state":"output-available","input":{"q":"x"},"output":null}`},
		{"tool error", pFailed(call, `"bad"`, "bad"), `{"type":"tool","toolCallId":"c1","toolName":"search","state":"output-error","input":{"q":"x"},"output":"bad","errorText":"bad"}`},
		{"tool error without output", pFailed(call, ``, ""), `{"type":"tool","toolCallId":"c1","toolName":"search","state":"output-error","input":{"q":"x"},"errorText":""}`},
		{"file", projection.Part{Type: record.PartFile, MediaType: "text/plain", URL: "https://x/y"}, `{"type":"file","mediaType":"text/plain","url":"https://x/y"}`},
		{"data", projection.Part{Type: record.PartData, Name: "n"}, `{"type":"data","name":"n","data":null}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := jsonOf(t, c.part); got != c.want {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
		})
	}
}

func TestViewIsACopy(t *testing.T) {
	p := projection.NewProjector()
	p.Apply(assistant("a1", "", toolCall("c1", "search", `{"q":"x"}`)), settlement("x1", "a1", record.Settlement{SubmissionID: "s1", Outcome: record.OutcomeFailed, Error: &record.Failure{Message: "m"}}))
	v := p.View()
	before := jsonOf(t, v)

	p.Apply(toolResult("r1", "x1", "c1", false, `1`))
	if got := jsonOf(t, v); got != before {
		t.Errorf("Apply changed an earlier view:\n got %s\nwant %s", got, before)
	}

	// Editing a view must not reach the projector either.
	v.Messages[0].Parts[0].Input[1] = 'Q'
	v.Settlements[0].Error.Message = "edited"
	v2 := p.View()
	if string(v2.Messages[0].Parts[0].Input) != `{"q":"x"}` || v2.Settlements[0].Error.Message != "m" {
		t.Errorf("editing a view changed the projector: %s", jsonOf(t, v2))
	}
}

func TestActivePath(t *testing.T) {
	ids := func(es []record.Entry) []string {
		out := []string{}
		for _, e := range es {
			out = append(out, e.ID)
		}
		return out
	}
	cases := []struct {
		name    string
		records []record.Record
		want    []string
	}{
		{"empty", nil, []string{}},
		{"linear", []record.Record{user("u1", ""), assistant("a1", "u1"), user("u2", "a1")}, []string{"u1", "a1", "u2"}},
		{"truncated", []record.Record{user("u1", ""), assistant("a1", "u1"), truncated("u1")}, []string{"u1"}},
		{"truncated to start", []record.Record{user("u1", ""), truncated("")}, []string{}},
		{"branch", []record.Record{user("u1", ""), assistant("a1", "u1"), user("u2", "u1")}, []string{"u1", "u2"}},
		{"unknown truncation", []record.Record{user("u1", ""), truncated("zz")}, []string{"u1"}},
		{"unknown parent ends the chain", []record.Record{user("u1", ""), user("u2", "zz")}, []string{"u2"}},
		{"loop", []record.Record{user("u1", "u2"), user("u2", "u1")}, []string{"u1", "u2"}},
		{"duplicate id", []record.Record{user("u1", ""), user("u2", "u1"), user("u1", "u2")}, []string{"u1", "u2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ids(projection.ActivePath(c.records)); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}
