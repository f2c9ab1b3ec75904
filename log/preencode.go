package log

import (
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/convlog/convlog/log/record"
	"github.com/oklog/ulid/v2"
)

// preEncoded is an entry record's stored JSON, encoded in the writer's own
// goroutine before it queues for the committer: the single committer is
// the engine's bottleneck, and JSON encoding was a third of its CPU. Only
// the parent id and the timestamp are left to the transaction, which alone
// knows the stream's leaf and the commit's clock.
type preEncoded struct {
	// head is `{"kind":"entry","entry":{"id":"…","parentId":` and tail
	// `,"type":…,"payload":…}}`: the bytes marshalNoHTML would write around
	// the two fields the transaction fills in.
	head, tail []byte
	// generated is true when the id was made here: a fresh ULID needs no
	// lookup for a duplicate inside the transaction.
	generated bool
}

type entryTailJSON struct {
	Type         string          `json:"type"`
	SubmissionID string          `json:"submissionId,omitempty"`
	TurnID       string          `json:"turnId,omitempty"`
	Payload      json.RawMessage `json:"payload"`
}

// preEncode returns a copy of records with the ids and default payloads
// filled in, and the pre-encoded form of each entry. A record it cannot
// pre-encode (a truncation, an invalid record, an unusual timestamp) gets
// no preEncoded and is checked and encoded inside the transaction as
// before, so errors are reported exactly where and as they were.
func preEncode(records []record.Record) ([]record.Record, []*preEncoded) {
	out := make([]record.Record, len(records))
	pre := make([]*preEncoded, len(records))
	for i, r := range records {
		out[i] = r
		if r.Kind != record.KindEntry || r.Entry == nil || r.Validate() != nil {
			continue
		}
		e := *r.Entry
		if !e.Timestamp.IsZero() {
			if _, err := e.Timestamp.MarshalJSON(); err != nil {
				continue
			}
		}
		p := &preEncoded{}
		if e.ID == "" {
			e.ID, p.generated = ulid.Make().String(), true
		}
		if len(e.Payload) == 0 {
			e.Payload = json.RawMessage("{}")
		}
		tail, err := marshalNoHTML(entryTailJSON{Type: e.Type, SubmissionID: e.SubmissionID, TurnID: e.TurnID, Payload: e.Payload})
		if err != nil {
			// The transaction reports it, as ErrInvalidRecord, in order.
			continue
		}
		head := make([]byte, 0, 48+len(e.ID))
		head = append(head, `{"kind":"entry","entry":{"id":`...)
		head = appendJSONString(head, e.ID)
		head = append(head, `,"parentId":`...)
		tail[0] = ','
		p.head, p.tail = head, append(tail, '}')
		r.Entry = &e
		out[i], pre[i] = r, p
	}
	return out, pre
}

// appendTo writes the entry's stored JSON with its parent and timestamp.
func (p *preEncoded) appendTo(buf []byte, parent string, ts time.Time) []byte {
	buf = append(buf, p.head...)
	buf = appendJSONString(buf, parent)
	buf = append(buf, `,"timestamp":"`...)
	buf = ts.AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, '"')
	return append(buf, p.tail...)
}

// appendJSONString appends s quoted exactly as the stored records quote
// strings (marshalNoHTML): ids are nearly always plain ASCII, which is
// copied; anything else goes through the encoder.
func appendJSONString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			b, _ := marshalNoHTML(s)
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}
