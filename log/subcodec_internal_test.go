package log

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"github.com/convlog/convlog/log/record"
	"reflect"
	"testing"
	"time"
)

func subcodecSamples() []storedSubmission {
	at := time.Date(2026, 12, 1, 22, 0, 0, 123456789, time.UTC)
	return []storedSubmission{
		{}, // every field zero
		{Submission: record.Submission{ID: "sub_01", Offset: "0", Status: record.StatusAdmitted, EntryID: "01E", AdmittedAt: at, UID: "gen_1"},
			Agent: "echo", Instance: "i", Session: "default", Seq: 1},
		{Submission: record.Submission{ID: "sub_02", Offset: "17", Status: record.StatusRunning, TurnID: "turn_1", AdmittedAt: at, StartedAt: at.Add(time.Millisecond)},
			Agent: "a", Instance: "ü ñ", Session: "s", Seq: 1 << 40},
		{Submission: record.Submission{ID: "sub_03", Offset: "3", Status: record.StatusFailed, TurnID: "turn_2", AnsweredBySubmissionID: "sub_02",
			Error:      &record.Failure{Code: "interrupted", Message: "the service stopped\nwhile it ran", Retryable: true},
			AdmittedAt: at, StartedAt: at, SettledAt: at.Add(time.Hour)}, Agent: "a", Instance: "b", Session: "c", Seq: 3},
		{Submission: record.Submission{ID: "sub_04", Status: record.StatusAborted, Error: &record.Failure{Message: "aborted"}, AdmittedAt: at}, Seq: 4},
	}
}

// subcodecV2Samples have approvals or their times: the V2 form.
func subcodecV2Samples() []storedSubmission {
	at := time.Date(2026, 12, 1, 22, 0, 0, 123456789, time.UTC)
	req := func(id string) record.ApprovalRequest {
		return record.ApprovalRequest{ApprovalID: id, ToolCallID: "call_" + id, ToolName: "refund", Input: json.RawMessage(`{"amount":5}`)}
	}
	waiting := storedSubmission{Submission: record.Submission{ID: "sub_05", Offset: "9", Status: record.StatusInputRequired, TurnID: "turn_1",
		AdmittedAt: at, StartedAt: at, UID: "gen_1", WaitingSince: at.Add(time.Second), ApprovalDeadline: at.Add(time.Hour),
		Approvals: []record.Approval{
			{ApprovalRequest: req("a1"), Decided: true, Approved: true, Reason: "ok", EditedInput: json.RawMessage(`{"amount":3}`), DecidedAt: at.Add(time.Minute)},
			{ApprovalRequest: req("a2")},
			{ApprovalRequest: record.ApprovalRequest{ApprovalID: "a3", ToolCallID: "c3"}, Decided: true, Reason: record.ReasonTimeout, DecidedAt: at.Add(2 * time.Hour)},
		}}, Agent: "a", Instance: "b", Session: "c", Seq: 5}
	waiting.derivePending()
	return []storedSubmission{
		waiting,
		// A voided wait: aborted, its approvals kept, nothing pending.
		{Submission: record.Submission{ID: "sub_06", Status: record.StatusAborted, Error: &record.Failure{Code: "stream_reset"}, AdmittedAt: at,
			Approvals: []record.Approval{{ApprovalRequest: req("b1")}}, WaitingSince: at}, Seq: 6},
		// Only a time.
		{Submission: record.Submission{ID: "sub_07", Status: record.StatusRunning, WaitingSince: at}, Seq: 7},
	}
}

// The V1 bytes of subcodecSamples, as the encoder wrote them before V2:
// a submission without approvals is stored exactly as before.
var subcodecV1Golden = []string{
	"01000000000000000000000000000000",
	"01067375625f303101300861646d69747465640330314500000567656e5f31046563686f01690764656661756c7401aab4aca4f78ba0ed31000000",
	"01067375625f30320231370772756e6e696e6700067475726e5f310000016105c3bc20c3b10173808080808020aab4aca4f78ba0ed31aabda6a5f78ba0ed310000",
	"01067375625f30330133066661696c656400067475726e5f32067375625f30320001610162016303aab4aca4f78ba0ed31aab4aca4f78ba0ed31aab4f1afbddda1ed31010b696e7465727275707465642074686520736572766963652073746f707065640a7768696c652069742072616e01",
	"01067375625f3034000761626f727465640000000000000004aab4aca4f78ba0ed31000001000761626f7274656400",
}

func TestSubmissionCodecV1Unchanged(t *testing.T) {
	for i, s := range subcodecSamples() {
		if got := hex.EncodeToString(encodeSubmission(&s)); got != subcodecV1Golden[i] {
			t.Fatalf("sample %d: V1 bytes changed\n got %s\nwant %s", i, got, subcodecV1Golden[i])
		}
	}
}

// Approvals round-trip in the V2 form, Pending is derived on decode (and
// only while input_required), and damage is refused.
func TestSubmissionCodecV2(t *testing.T) {
	for i, want := range subcodecV2Samples() {
		enc := encodeSubmission(&want)
		if enc[0] != subFormatV2 {
			t.Fatalf("sample %d: format %d", i, enc[0])
		}
		var got storedSubmission
		if err := decodeSubmission(enc, &got); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("sample %d: V2 round trip\n got %+v\nwant %+v", i, got, want)
		}
		for _, bad := range [][]byte{enc[:len(enc)-1], append(append([]byte(nil), enc...), 0)} {
			var s storedSubmission
			if err := decodeSubmission(bad, &s); !errors.Is(err, errSubmissionFormat) {
				t.Fatalf("sample %d: decode of %d damaged bytes: %v", i, len(bad), err)
			}
		}
	}
	w := subcodecV2Samples()[0]
	if len(w.Pending) != 1 || w.Pending[0].ApprovalID != "a2" || !w.Waiting() || w.Resumable() {
		t.Fatalf("pending %+v", w.Pending)
	}
	if v := subcodecV2Samples()[1]; len(v.Pending) != 0 || v.Waiting() || v.Resumable() {
		t.Fatalf("voided wait pending %+v", v.Pending)
	}
}

// The binary form carries every field of a stored submission; a value
// written as JSON by an earlier version still reads the same.
func TestSubmissionCodec(t *testing.T) {
	for i, want := range subcodecSamples() {
		var got storedSubmission
		if err := decodeSubmission(encodeSubmission(&want), &got); err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("sample %d: binary round trip\n got %+v\nwant %+v", i, got, want)
		}
		legacy, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		var old storedSubmission
		if err := decodeSubmission(legacy, &old); err != nil {
			t.Fatalf("sample %d: legacy JSON: %v", i, err)
		}
		if !reflect.DeepEqual(old, want) {
			t.Fatalf("sample %d: legacy JSON\n got %+v\nwant %+v", i, old, want)
		}
	}
	enc := encodeSubmission(&subcodecSamples()[3])
	for _, bad := range [][]byte{nil, {}, {9}, enc[:len(enc)-1], append(append([]byte(nil), enc...), 0)} {
		var s storedSubmission
		if err := decodeSubmission(bad, &s); !errors.Is(err, errSubmissionFormat) {
			t.Fatalf("decode of %d damaged bytes: %v", len(bad), err)
		}
	}
}

// A damaged value never panics the decoder, and whatever it accepts
// encodes back to the same bytes.
func FuzzDecodeSubmission(f *testing.F) {
	for _, s := range append(subcodecSamples(), subcodecV2Samples()...) {
		f.Add(encodeSubmission(&s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		var s storedSubmission
		if decodeSubmission(v, &s) != nil || len(v) == 0 || (v[0] != subFormatV1 && v[0] != subFormatV2) {
			return
		}
		if again := encodeSubmission(&s); string(again) != string(v) {
			// Only a non-canonical varint or a time the decoder normalises
			// may differ; both must decode to the same submission.
			var s2 storedSubmission
			if err := decodeSubmission(again, &s2); err != nil || !reflect.DeepEqual(s, s2) {
				t.Fatalf("re-encoding changed the submission: %v\n%+v\n%+v", err, s, s2)
			}
		}
	})
}
