package wire_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/convlog/convlog/transport/wire"
)

// The delta frame's JSON form, byte for byte as worker/natsbus published
// it before the type moved here: readers parse it (docs/protocol.md 4.1).
func TestDeltaFrameJSON(t *testing.T) {
	for _, tc := range []struct {
		f    wire.DeltaFrame
		want string
	}{
		{wire.DeltaFrame{}, `{"type":"","turnId":"","submissionId":""}`},
		{wire.DeltaFrame{Type: wire.FrameDelta, TurnID: "turn_1", SubmissionID: "sub_1", Kind: "text", Delta: "Hel<lo> & \u2028"},
			`{"type":"delta","turnId":"turn_1","submissionId":"sub_1","kind":"text","delta":"Hel\u003clo\u003e \u0026 \u2028"}`},
		{wire.DeltaFrame{Type: wire.FrameToolCallDelta, TurnID: "turn_1", SubmissionID: "sub_1", ToolCallID: "c1", ToolName: "f", Args: json.RawMessage(`{"a": 1}`)},
			`{"type":"toolcall_delta","turnId":"turn_1","submissionId":"sub_1","toolCallId":"c1","toolName":"f","args":{"a":1}}`},
		{wire.DeltaFrame{Type: wire.FrameToolCallDelta, TurnID: "turn_1", SubmissionID: "sub_1", ToolCallID: "c1", ToolName: "f", ArgsDelta: `{"a"`},
			`{"type":"toolcall_delta","turnId":"turn_1","submissionId":"sub_1","toolCallId":"c1","toolName":"f","argsDelta":"{\"a\""}`},
		{wire.DeltaFrame{Type: wire.FrameRetrying, TurnID: "t", SubmissionID: "s", Attempt: 2, MaxAttempts: 5, DelayMs: 1500, Reason: "rate_limited"},
			`{"type":"retrying","turnId":"t","submissionId":"s","attempt":2,"maxAttempts":5,"delayMs":1500,"reason":"rate_limited"}`},
		{wire.DeltaFrame{Type: wire.FrameEvent, TurnID: "t", SubmissionID: "s", Event: json.RawMessage(`{"type":"x.custom","n":[1, 2]}`)},
			`{"type":"event","turnId":"t","submissionId":"s","event":{"type":"x.custom","n":[1,2]}}`},
	} {
		b, err := json.Marshal(tc.f)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("Marshal(%+v)\n got %s\nwant %s", tc.f, b, tc.want)
		}
		var back wire.DeltaFrame
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		again, _ := json.Marshal(back)
		if string(again) != tc.want {
			t.Errorf("round trip of %s gives %s", tc.want, again)
		}
		if tc.f.Args == nil && tc.f.Event == nil && !reflect.DeepEqual(back, tc.f) {
			t.Errorf("Unmarshal(%s) = %+v, want %+v", b, back, tc.f)
		}
	}
}
