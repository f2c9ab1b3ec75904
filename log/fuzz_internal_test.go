package log

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/convlog/convlog/log/record"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// Fuzz targets for the parsers of outside input (offsets, names, records)
// and of stored bytes (batches, stream meta, keys), and for the append/read
// path as a whole. Run one with
//
//	go test ./log -run='^$' -fuzz='^FuzzParseOffset$' -fuzztime=15s

func FuzzParseOffset(f *testing.F) {
	for _, s := range []string{
		"0", "1", "42", "1000", "00", "01", "-1", "+1", " 1", "1 ", "1e3", "0x10", "",
		"18446744073709551615", "18446744073709551616", "99999999999999999999",
		"000000000000000000001", "١", "1\x00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := record.ParseOffset(s)
		n, perr := strconv.ParseUint(s, 10, 64)
		canonical := perr == nil && strconv.FormatUint(n, 10) == s
		if err != nil {
			if !errors.Is(err, ErrInvalidOffset) {
				t.Fatalf("ParseOffset(%q): %v does not wrap ErrInvalidOffset", s, err)
			}
			if canonical {
				t.Fatalf("ParseOffset(%q) rejects a canonical offset: %v", s, err)
			}
			return
		}
		if !canonical {
			t.Fatalf("ParseOffset(%q) accepts a non-canonical offset", s)
		}
		if string(o) != s {
			t.Fatalf("ParseOffset(%q) = %q", s, o)
		}
		pos, err := o.Position()
		if err != nil || pos != n || record.OffsetOf(pos) != o {
			t.Fatalf("%q: position %d %v, offsetOf %q", s, pos, err, record.OffsetOf(pos))
		}
	})
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$`)

func FuzzValidateName(f *testing.F) {
	for _, s := range [][3]string{
		{"echo", "i1", "default"},
		{"a", "b", "c"},
		{"agent.v2", "host:8080", "user@example.com"},
		{"A_b-c", "0", "x-y_z.w"},
		{"", "i", "s"},
		{".dot", "i", "s"},
		{"a/b", "i", "s"},
		{"a\x00b", "i", "s"},
		{"é", "i", "s"},
		{"a b", "i", "s"},
		{string(bytes.Repeat([]byte("x"), 128)), "i", "s"},
		{string(bytes.Repeat([]byte("x"), 129)), "i", "s"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, agent, instance, session string) {
		valid := true
		for _, name := range []string{agent, instance, session} {
			err := record.ValidateName(name)
			want := nameRE.MatchString(name)
			if (err == nil) != want {
				t.Fatalf("ValidateName(%q) = %v, want valid %v", name, err, want)
			}
			if err != nil {
				valid = false
				if !errors.Is(err, ErrInvalidName) {
					t.Fatalf("ValidateName(%q): %v does not wrap ErrInvalidName", name, err)
				}
				continue
			}
			if len(name) < 1 || len(name) > record.MaxNameLength {
				t.Fatalf("ValidateName accepts %q of %d bytes", name, len(name))
			}
		}
		k := record.Key{Agent: agent, Instance: instance, Session: session}
		if err := k.Validate(); (err == nil) != valid {
			t.Fatalf("%q.Validate() = %v, names valid %v", k, err, valid)
		}
		got, err := decodeKey(encodeKey(k))
		if valid {
			if err != nil || got != k {
				t.Fatalf("decodeKey(encode(%q)) = %q, %v", k, got, err)
			}
		} else if err == nil {
			t.Fatalf("decodeKey(encode(%q)) accepts an invalid key as %q", k, got)
		}
		// Arbitrary stored bytes: no panic; what is accepted re-encodes
		// to the same bytes.
		raw := []byte(agent)
		if k2, err := decodeKey(raw); err == nil && !bytes.Equal(encodeKey(k2), raw) {
			t.Fatalf("decodeKey(%q) = %q, which encodes as %q", raw, k2, encodeKey(k2))
		}
	})
}

func FuzzRecordJSON(f *testing.F) {
	for _, s := range []string{
		`{"kind":"entry","entry":{"id":"e1","parentId":"","timestamp":"2024-01-02T03:04:05.123456789Z","type":"user_message","payload":{"parts":[{"type":"text","text":"hi"}]}}}`,
		`{"kind":"entry","entry":{"id":"e2","parentId":"e1","timestamp":"2024-01-02T03:04:05+02:00","type":"custom","submissionId":"s","turnId":"t","payload":[1,2,3]}}`,
		`{"kind":"entry","entry":{"id":"e3","type":"x"}}`,
		`{"kind":"entry","entry":null}`,
		`{"kind":"entry"}`,
		`{"kind":"entry","entry":"nope"}`,
		`{"kind":"truncated","rewoundTo":"e1","newLeafId":"e1","reason":"retry"}`,
		`{"kind":"truncated"}`,
		`{"kind":"branch","whatever":1}`,
		`{}`, `null`, `[]`, `"entry"`, `{"kind":1}`, ``, `{`,
		`{"kind":"entry","entry":{"payload":{ "a" : 1 }}}`,
		`{"KIND":"truncated","RewoundTo":"\u00e9\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r record.Record
		if err := r.UnmarshalJSON(b); err != nil {
			if !errors.Is(err, ErrInvalidRecord) {
				t.Fatalf("UnmarshalJSON(%q): %v does not wrap ErrInvalidRecord", b, err)
			}
			return
		}
		if r.Kind != record.KindEntry && r.Kind != record.KindTruncated {
			if r.Entry != nil || r.RewoundTo != "" || r.NewLeafID != "" || r.Reason != "" {
				t.Fatalf("unknown kind %q decoded with fields: %+v", r.Kind, r)
			}
			if _, err := json.Marshal(r); err == nil {
				t.Fatalf("kind %q marshals", r.Kind)
			}
			return
		}
		m1, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("%q decodes to %+v, which does not marshal: %v", b, r, err)
		}
		var r2 record.Record
		if err := json.Unmarshal(m1, &r2); err != nil {
			t.Fatalf("%q: marshalled %s does not unmarshal: %v", b, m1, err)
		}
		if err := sameRecord(r, r2); err != nil {
			t.Fatalf("%q: round trip through %s: %v", b, m1, err)
		}
		m2, err := json.Marshal(r2)
		if err != nil || !bytes.Equal(m1, m2) {
			t.Fatalf("%q: marshals as %s, then as %s (%v)", b, m1, m2, err)
		}
	})
}

// sameRecord compares records as JSON would: instants rather than time
// representations, payloads as compact JSON, and a missing payload as null.
func sameRecord(a, b record.Record) error {
	if a.Kind != b.Kind || a.RewoundTo != b.RewoundTo || a.NewLeafID != b.NewLeafID || a.Reason != b.Reason {
		return fmt.Errorf("kind %q %q %q %q != %q %q %q %q", a.Kind, a.RewoundTo, a.NewLeafID, a.Reason, b.Kind, b.RewoundTo, b.NewLeafID, b.Reason)
	}
	if (a.Entry == nil) != (b.Entry == nil) {
		return fmt.Errorf("entry %v != %v", a.Entry, b.Entry)
	}
	if a.Entry == nil {
		return nil
	}
	x, y := *a.Entry, *b.Entry
	if !x.Timestamp.Equal(y.Timestamp) {
		return fmt.Errorf("timestamp %v != %v", x.Timestamp, y.Timestamp)
	}
	if px, py := compactJSON(x.Payload), compactJSON(y.Payload); px != py {
		return fmt.Errorf("payload %q != %q", px, py)
	}
	if x.ID != y.ID || x.ParentID != y.ParentID || x.Type != y.Type || x.SubmissionID != y.SubmissionID || x.TurnID != y.TurnID {
		return fmt.Errorf("entry id %q parent %q type %q submission %q turn %q != %q %q %q %q %q",
			x.ID, x.ParentID, x.Type, x.SubmissionID, x.TurnID, y.ID, y.ParentID, y.Type, y.SubmissionID, y.TurnID)
	}
	return nil
}

func compactJSON(b []byte) string {
	if len(b) == 0 {
		return "null"
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return "invalid:" + string(b)
	}
	return buf.String()
}

func FuzzDecodeBatch(f *testing.F) {
	valid := func(recs ...record.Record) []byte {
		v, err := encodeBatch(recs)
		if err != nil {
			f.Fatal(err)
		}
		return v
	}
	ts := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Add(valid(record.EntryRecord(record.Entry{ID: "a", Timestamp: ts, Type: "user_message", Payload: json.RawMessage(`{}`)})))
	f.Add(valid(record.TruncatedRecord("", "x"), record.EntryRecord(record.Entry{ID: "b", ParentID: "", Timestamp: ts, Type: "t", Payload: json.RawMessage(`[1]`)})))
	for _, s := range []string{"", "\x00", "\x00[]", "\x01", "\x01[", "\x01[]", "\x01[{}]", "[]",
		"\x80\x08[]", "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01[]", "\x81\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80[]", "\x01 []"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		count, records, err := decodeBatchHeader(v)
		wantCount, n := binary.Uvarint(v)
		bracketed := n > 0 && len(v)-n >= 2 && v[n] == '[' && v[len(v)-1] == ']'
		if err != nil {
			if n > 0 && wantCount >= 1 && wantCount <= record.MaxRecordsBatch && bracketed {
				t.Fatalf("decodeBatchHeader(%q) rejects a well-formed header: %v", v, err)
			}
			return
		}
		if n <= 0 || count != wantCount || count < 1 || count > record.MaxRecordsBatch {
			t.Fatalf("decodeBatchHeader(%q): count %d, uvarint %d (%d bytes)", v, count, wantCount, n)
		}
		if !bracketed || !bytes.Equal(records, v[n:]) {
			t.Fatalf("decodeBatchHeader(%q): records %q", v, records)
		}
		// The records are served as they are; decoding them must not
		// panic, and a batch the engine could have written survives
		// re-encoding.
		recs, err := record.RawRecords(records).Decode()
		if err != nil || uint64(len(recs)) != count {
			return
		}
		for _, r := range recs {
			if r.Kind != record.KindEntry && r.Kind != record.KindTruncated {
				return
			}
		}
		again, err := encodeBatch(recs)
		if err != nil {
			t.Fatalf("%q decodes to records that do not encode: %v", v, err)
		}
		c2, rec2, err := decodeBatchHeader(again)
		if err != nil || c2 != count {
			t.Fatalf("re-encoded %q: count %d, %v", again, c2, err)
		}
		recs2, err := record.RawRecords(rec2).Decode()
		if err != nil || len(recs2) != len(recs) {
			t.Fatalf("re-encoded %q: %v", again, err)
		}
		for i := range recs {
			if err := sameRecord(recs[i], recs2[i]); err != nil {
				t.Fatalf("re-encoded %q: record %d: %v", again, i, err)
			}
		}
	})
}

func FuzzDecodeStreamMeta(f *testing.F) {
	m := streamMeta{id: 7, next: 42, created: 1700000000000000000, leaf: "01HLEAF"}
	m.inc[0], m.inc[15] = 1, 2
	f.Add(m.encode())
	f.Add((&streamMeta{}).encode())
	f.Add((&streamMeta{id: ^uint64(0), next: ^uint64(0), created: -1}).encode())
	f.Add([]byte{})
	f.Add([]byte("short"))
	f.Add(make([]byte, streamMetaFixed-1))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeStreamMeta(b)
		if err != nil {
			if len(b) >= streamMetaFixed {
				t.Fatalf("decodeStreamMeta rejects %d bytes: %v", len(b), err)
			}
			return
		}
		if len(b) < streamMetaFixed {
			t.Fatalf("decodeStreamMeta accepts %d bytes", len(b))
		}
		if again := m.encode(); !bytes.Equal(again, b) {
			t.Fatalf("decodeStreamMeta(%x) = %+v, which encodes as %x", b, m, again)
		}
	})
}

// FuzzAppendRead appends fuzz-made records to a real log: the append either
// fails with one of the engine's errors, or a read gives back exactly what
// the append reported, and that is what was asked for.
func FuzzAppendRead(f *testing.F) {
	f.Add(uint8(0), "", "", "user_message", []byte(`{"parts":[{"type":"text","text":"hi"}]}`), "", int64(0))
	f.Add(uint8(1), "e1", "", "custom", []byte(`[1, 2, 3]`), "", int64(0))
	f.Add(uint8(2), "e1", "", "t", []byte(``), "rewind", int64(0))
	f.Add(uint8(3), "", "nope", "t", []byte(`{}`), "", int64(0))
	f.Add(uint8(4), "", "", "", []byte(`{}`), "", int64(0))
	f.Add(uint8(5), "x", "", "t", []byte(`{not json`), "", int64(0))
	f.Add(uint8(6), "a", "", "t\n", []byte(`null`), "", int64(0))
	f.Add(uint8(7), "é", "", "t", []byte(`"s"`), "ok", int64(0))
	f.Add(uint8(1), "ts", "", "t", []byte(`{}`), "", int64(1700000000))
	f.Add(uint8(0), "", "", "t", []byte(`{}`), "", int64(-62135596801)) // year 0
	f.Add(uint8(0), "", "", "t", []byte(`{}`), "", int64(253402300800)) // year 10000

	db, err := Open(filepath.Join(f.TempDir(), "fuzz.db"), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = db.Close() })
	var streams atomic.Uint64
	ctx := context.Background()

	f.Fuzz(func(t *testing.T, shape uint8, id, parent, typ string, payload []byte, reason string, ts int64) {
		// A fresh stream per input: bits 0-1 of shape are the number of
		// records (1-4), bits 2-5 which of them are truncations. Record i
		// has id id+i (when id is set); truncations rewind to entry 0.
		// Entries have timestamp ts seconds after the epoch (0: unset).
		key := record.Key{Agent: "fuzz", Instance: "i", Session: "s" + strconv.FormatUint(streams.Add(1), 10)}
		n := 1 + int(shape&3)
		recs := make([]record.Record, n)
		for i := range recs {
			eid := id
			if id != "" && i > 0 {
				eid = id + strconv.Itoa(i)
			}
			if shape&(4<<i) != 0 {
				to := ""
				if id != "" {
					to = id
				}
				recs[i] = record.TruncatedRecord(to, reason)
				continue
			}
			p := parent
			if i > 0 {
				p = ""
			}
			var at time.Time
			if ts != 0 {
				at = time.Unix(ts, 0)
			}
			recs[i] = record.EntryRecord(record.Entry{ID: eid, ParentID: p, Type: typ, Payload: payload, Timestamp: at})
		}
		app, err := db.Append(ctx, key, recs...)
		if err != nil {
			for _, want := range []error{ErrInvalidRecord, ErrUnknownEntry, ErrDuplicateEntry} {
				if errors.Is(err, want) {
					return
				}
			}
			t.Fatalf("append %+v: untyped error %v", recs, err)
		}
		if app.Offset != record.Start || len(app.Records) != n {
			t.Fatalf("append: %+v", app)
		}
		res, err := db.Read(ctx, key, record.Start, 0)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if len(res.Batches) != 1 || res.NextOffset != app.NextOffset || !res.UpToDate || res.Incarnation != app.Incarnation {
			t.Fatalf("read %+v after append %+v", res, app)
		}
		b := res.Batches[0]
		if b.Offset != app.Offset || b.Count != n {
			t.Fatalf("batch at %s of %d, appended at %s %d", b.Offset, b.Count, app.Offset, n)
		}
		if !json.Valid(b.Records) {
			t.Fatalf("stored records are not JSON: %q", b.Records)
		}
		got, err := b.Records.Decode()
		if err != nil || len(got) != n {
			t.Fatalf("decode %q: %d records, %v", b.Records, len(got), err)
		}
		for i := range got {
			if err := sameRecord(app.Records[i], got[i]); err != nil {
				t.Fatalf("record %d: appended and read differ: %v\nstored %s", i, err, b.Records)
			}
			want := recs[i]
			switch want.Kind {
			case record.KindEntry:
				e := got[i].Entry
				if (want.Entry.ID != "" && e.ID != want.Entry.ID) || e.Type != want.Entry.Type {
					t.Fatalf("record %d: stored id %q type %q, asked for %q %q", i, e.ID, e.Type, want.Entry.ID, want.Entry.Type)
				}
				if ts != 0 && !e.Timestamp.Equal(time.Unix(ts, 0)) {
					t.Fatalf("record %d: stored timestamp %v, asked for %v", i, e.Timestamp, time.Unix(ts, 0))
				}
				if len(payload) > 0 && compactJSON(e.Payload) != compactJSON(payload) {
					t.Fatalf("record %d: stored payload %q, asked for %q", i, e.Payload, payload)
				}
			case record.KindTruncated:
				if got[i].RewoundTo != want.RewoundTo || got[i].Reason != want.Reason {
					t.Fatalf("record %d: stored truncation %+v, asked for %+v", i, got[i], want)
				}
			}
		}
		// Every stored entry id is known to the entry index under the
		// bytes the batch shows.
		for _, r := range got {
			if r.Kind != record.KindEntry {
				continue
			}
			dup := record.EntryRecord(record.Entry{ID: r.Entry.ID, Type: "t"})
			if _, err := db.Append(ctx, key, dup); !errors.Is(err, ErrDuplicateEntry) {
				t.Fatalf("re-appending stored id %q: %v, want ErrDuplicateEntry", r.Entry.ID, err)
			}
		}
	})
}

// TestInvalidUTF8Rejected is the regression test for what FuzzAppendRead
// found: strings that are not UTF-8 were accepted, then rewritten to U+FFFD
// by the JSON encoder, so that what Append reported was not what Read
// served. They are refused now, everywhere a string is stored.
func TestInvalidUTF8Rejected(t *testing.T) {
	ctx := context.Background()
	db, err := Open(filepath.Join(t.TempDir(), "utf8.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	bad := []record.Record{
		record.EntryRecord(record.Entry{ID: "\xff", Type: "t"}),
		record.EntryRecord(record.Entry{Type: "t\xfe"}),
		record.EntryRecord(record.Entry{Type: "t", TurnID: "\xff"}),
		record.EntryRecord(record.Entry{Type: "t", Payload: []byte("\"\xff\"")}),
		{Kind: record.KindTruncated, Reason: "\x8f"},
	}
	for i, r := range bad {
		if _, err := db.Append(ctx, key, r); !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("record %d: err = %v, want ErrInvalidRecord", i, err)
		}
	}
	for _, a := range []Admission{
		{Key: key, SubmissionID: "sub\xff", Records: []record.Record{record.EntryRecord(record.Entry{Type: "t"})}},
		{Key: key, IdempotencyKey: "k\xff", Records: []record.Record{record.EntryRecord(record.Entry{Type: "t"})}},
	} {
		if _, _, err := db.Admit(ctx, a); !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("admission %+v: err = %v, want ErrInvalidRecord", a, err)
		}
	}
	if _, tail, _ := db.Tail(ctx, key); tail != record.Start {
		t.Fatalf("a refused write left records: tail %s", tail)
	}
}
