package transport_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/wire"
)

var clientCodes = map[string]bool{
	wire.CodeBadRequest: true, wire.CodeInvalidName: true,
	wire.CodeInvalidUTF8: true, wire.CodeDuplicateKey: true, wire.CodeNumberOutOfRange: true,
}

// FuzzDecodeDelivery: any body either decodes to a delivery the log can
// store or is refused with a 400; it never panics.
func FuzzDecodeDelivery(f *testing.F) {
	for _, seed := range []string{
		`{"message":"hi"}`,
		`{"message":{"kind":"user","body":"hi","parts":[{"type":"text","text":"x"}],"purpose":"advisory","display":"diagnostic","metadata":{"a":1}},"session":"s","initialData":[1,2],"uid":"u"}`,
		`{"message":{"kind":"user","parts":[{"type":"file","mediaType":"text/plain","url":"data:,x","filename":"f"},{"type":"data","name":"n","data":null}]}}`,
		`{"message":{"kind":"user","body":"hi","metadata":{"uid":"x"}},"uid":"y"}`,
		`{"message":""}`, `{"message":null}`, `{"message":1}`, `{}`, `[]`, `null`, ``, `{"message":"a"}{}`,
		`{"message":{"kind":"user","body":"\ud800"}}`, `{"message":"hi","session":"é"}`,
		`{"message":{"kind":"user","parts":[{"type":"tool-call","input":{}}]}}`,
		`{"Message":"case"}`, `{"message":"a","message":"b"}`, `{"message":"x","initialData":1e999}`, `{"message":{"kind":"user","body":"x","metadata":null},"initialData":null}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := transport.DecodeDelivery(body)
		if err != nil {
			var ae *wire.APIError
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest ||
				!clientCodes[ae.Code] || ae.Message == "" {
				t.Fatalf("not a client error: %#v", err)
			}
			return
		}
		if err := record.ValidateName(d.Session); err != nil {
			t.Fatalf("session %q: %v", d.Session, err)
		}
		if len(d.Payload.Parts) == 0 {
			t.Fatal("no parts")
		}
		for _, p := range d.Payload.Parts {
			if p.Type != record.PartText && p.Type != record.PartFile && p.Type != record.PartData {
				t.Fatalf("part type %q", p.Type)
			}
		}
		if m := d.Payload.Metadata; len(m) > 0 {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(m, &obj); err != nil {
				t.Fatalf("metadata %s is not an object: %v", m, err)
			}
		}
		rec, err := d.Record()
		if err != nil {
			t.Fatalf("record: %v", err)
		}
		b, err := json.Marshal(rec)
		if err != nil || !json.Valid(b) {
			t.Fatalf("record JSON %s: %v", b, err)
		}
	})
}
