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
//
// subFormatV2 is V1 followed by the approvals and their deadlines. It is
// written only for a submission that has them, so every other one keeps
// the V1 bytes (and stays readable by a binary that predates approvals).
const (
	subFormatV1 = 1
	subFormatV2 = 2
)

var errSubmissionFormat = errors.New("stored submission: malformed")

func encodeSubmission(s *storedSubmission) []byte {
	b := make([]byte, 0, 192)
	v2 := len(s.Approvals) > 0 || !s.ApprovalDeadline.IsZero() || !s.WaitingSince.IsZero()
	if v2 {
		b = append(b, subFormatV2)
	} else {
		b = append(b, subFormatV1)
	}
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
		b = append(b, 0)
	} else {
		b = append(b, 1)
		for _, f := range []string{s.Error.Code, s.Error.Message} {
			b = appendString(b, f)
		}
		b = appendBool(b, s.Error.Retryable)
	}
	if !v2 {
		return b
	}
	b = binary.AppendUvarint(b, uint64(len(s.Approvals)))
	for _, a := range s.Approvals {
		for _, f := range []string{a.ApprovalID, a.ToolCallID, a.ToolName, string(a.Input), a.Reason, string(a.EditedInput)} {
			b = appendString(b, f)
		}
		b = appendBool(b, a.Decided)
		b = appendBool(b, a.Approved)
		b = appendTime(b, a.DecidedAt)
	}
	b = appendTime(b, s.ApprovalDeadline)
	return appendTime(b, s.WaitingSince)
}

func appendString(b []byte, f string) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	return append(b, f...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendTime(b []byte, t time.Time) []byte {
	var n int64
	if !t.IsZero() {
		n = t.UnixNano()
	}
	return binary.AppendVarint(b, n)
}

func decodeSubmission(v []byte, s *storedSubmission) error {
	if len(v) > 0 && v[0] == '{' {
		// written before the binary form
		if err := json.Unmarshal(v, s); err != nil {
			return err
		}
		s.derivePending()
		return nil
	}
	if len(v) == 0 || (v[0] != subFormatV1 && v[0] != subFormatV2) {
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
	s.Approvals, s.ApprovalDeadline, s.WaitingSince = nil, time.Time{}, time.Time{}
	if v[0] == subFormatV2 {
		n := d.uvarint()
		if n > uint64(len(d.b)) { // each approval takes bytes: a bad count fails here
			d.bad = true
			n = 0
		}
		for range n {
			var a record.Approval
			a.ApprovalID, a.ToolCallID, a.ToolName = d.string(), d.string(), d.string()
			a.Input = rawOf(d.string())
			a.Reason = d.string()
			a.EditedInput = rawOf(d.string())
			a.Decided, a.Approved = d.byte() == 1, d.byte() == 1
			a.DecidedAt = d.time()
			s.Approvals = append(s.Approvals, a)
		}
		s.ApprovalDeadline, s.WaitingSince = d.time(), d.time()
	}
	s.derivePending()
	if d.bad || len(d.b) != 0 {
		return fmt.Errorf("%w: %d bytes", errSubmissionFormat, len(v))
	}
	return nil
}

// rawOf is the stored form of a JSON value back: nil for none.
func rawOf(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
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

func (d *subDecoder) time() time.Time {
	if n := d.varint(); n != 0 {
		return time.Unix(0, n).UTC()
	}
	return time.Time{}
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
