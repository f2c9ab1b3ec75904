package log

import (
	"bytes"
	"encoding/json"
	"github.com/convlog/convlog/log/record"
	"testing"
	"time"
)

// TestPreEncodeMatchesMarshal: a batch encoded outside the committer must be
// byte for byte what json.Marshal writes, or readers would see two shapes.
func TestPreEncodeMatchesMarshal(t *testing.T) {
	now := time.Date(2026, 12, 1, 20, 0, 0, 123456789, time.UTC)
	zone := time.FixedZone("x", 5*3600+1800)
	recs := []record.Record{
		record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: json.RawMessage(`{ "parts" : [ {"type":"text","text":"a<b>&c é"} ] }`)}),
		record.EntryRecord(record.Entry{ID: "given-id", Type: "custom", TurnID: "t1", SubmissionID: "sub_<x>"}),
		record.EntryRecord(record.Entry{ID: "ü\"quoted\\", ParentID: "p&<>", Timestamp: time.Date(2020, 1, 2, 3, 4, 5, 0, zone), Type: "t", Payload: json.RawMessage(`[1, 2]`)}),
		record.EntryRecord(record.Entry{Type: "bad", Payload: json.RawMessage(`{`)}),
		record.TruncatedRecord("", "reset"),
		record.EntryRecord(record.Entry{Type: "far", Timestamp: time.Date(10001, 1, 1, 0, 0, 0, 0, time.UTC)}),
	}
	out, pre := preEncode(recs)
	if pre[0] == nil || pre[1] == nil || pre[2] == nil {
		t.Fatalf("valid entries not pre-encoded: %v", pre)
	}
	if pre[3] != nil || pre[4] != nil || pre[5] != nil {
		t.Fatalf("invalid entry, truncation or unencodable timestamp pre-encoded: %v", pre)
	}
	if !pre[0].generated || pre[1].generated {
		t.Fatalf("generated flags: %v %v", pre[0].generated, pre[1].generated)
	}
	for i := range out[:3] {
		e := *out[i].Entry
		if e.ParentID == "" {
			e.ParentID = "01PARENT"
		}
		if e.Timestamp.IsZero() {
			e.Timestamp = now
		}
		out[i].Entry = &e
	}
	got, err := encodeBatchPre(out[:3], pre[:3])
	if err != nil {
		t.Fatal(err)
	}
	want, err := encodeBatch(out[:3])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("pre-encoded batch differs:\n got %s\nwant %s", got, want)
	}
	if recs[0].Entry.ID != "" {
		t.Fatal("preEncode changed the caller's record")
	}
}
