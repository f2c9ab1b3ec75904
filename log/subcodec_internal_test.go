package log

import (
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
	for _, s := range subcodecSamples() {
		f.Add(encodeSubmission(&s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		var s storedSubmission
		if decodeSubmission(v, &s) != nil || len(v) == 0 || v[0] != subFormatV1 {
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
