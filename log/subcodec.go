package log

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/convlog/convlog/log/record"
	"time"
)

// Stored submissions are encoded in a compact binary form, led by the byte
// subFormatV1: the committer, the sweeps and the relay decode and encode
// them on every start, settlement and page, and JSON there cost about a
// tenth of the service's CPU under load. Values written before it are JSON
// (they begin with '{') and stay readable; they are rewritten in the new
// form when their submission next changes.
const subFormatV1 = 1

var errSubmissionFormat = errors.New("stored submission: malformed")

func encodeSubmission(s *storedSubmission) []byte {
	b := make([]byte, 0, 192)
	b = append(b, subFormatV1)
	for _, f := range []string{s.ID, string(s.Offset), string(s.Status), s.EntryID, s.TurnID,
		s.AnsweredBySubmissionID, s.UID, s.Agent, s.Instance, s.Session} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	b = binary.AppendUvarint(b, s.Seq)
	for _, t := range []time.Time{s.AdmittedAt, s.StartedAt, s.SettledAt} {
		var n int64
		if !t.IsZero() {
			n = t.UnixNano()
		}
		b = binary.AppendVarint(b, n)
	}
	if s.Error == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	for _, f := range []string{s.Error.Code, s.Error.Message} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	if s.Error.Retryable {
		return append(b, 1)
	}
	return append(b, 0)
}

func decodeSubmission(v []byte, s *storedSubmission) error {
	if len(v) > 0 && v[0] == '{' {
		return json.Unmarshal(v, s) // written before the binary form
	}
	if len(v) == 0 || v[0] != subFormatV1 {
		return fmt.Errorf("%w: unknown format", errSubmissionFormat)
	}
	d := subDecoder{b: v[1:]}
	var status, offset string
	for _, f := range []*string{&s.ID, &offset, &status, &s.EntryID, &s.TurnID,
		&s.AnsweredBySubmissionID, &s.UID, &s.Agent, &s.Instance, &s.Session} {
		*f = d.string()
	}
	s.Offset, s.Status = record.Offset(offset), record.Status(status)
	s.Seq = d.uvarint()
	for _, t := range []*time.Time{&s.AdmittedAt, &s.StartedAt, &s.SettledAt} {
		if n := d.varint(); n != 0 {
			*t = time.Unix(0, n).UTC()
		} else {
			*t = time.Time{}
		}
	}
	s.Error = nil
	if d.byte() == 1 {
		s.Error = &record.Failure{Code: d.string(), Message: d.string(), Retryable: d.byte() == 1}
	}
	if d.bad || len(d.b) != 0 {
		return fmt.Errorf("%w: %d bytes", errSubmissionFormat, len(v))
	}
	return nil
}

// subDecoder reads the binary form; a read past the end sets bad and
// yields zero values, checked once at the end.
type subDecoder struct {
	b   []byte
	bad bool
}

func (d *subDecoder) uvarint() uint64 {
	n, k := binary.Uvarint(d.b)
	if k <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[k:]
	return n
}

func (d *subDecoder) varint() int64 {
	n, k := binary.Varint(d.b)
	if k <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[k:]
	return n
}

func (d *subDecoder) string() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.bad, d.b = true, nil
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *subDecoder) byte() byte {
	if len(d.b) == 0 {
		d.bad = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}
