package record

import (
	"bytes"
	"encoding/json"
)

// EncodeJSON is json.Marshal as the log stores records: for payloads built
// outside the log (a delivery's message), so that they keep their size too.
func EncodeJSON(v any) ([]byte, error) { return marshalNoHTML(v) }

// marshalNoHTML is json.Marshal without HTML escaping. Stored records are
// served to API clients, not embedded in HTML, and escaping would grow each
// '<', '>' and '&' to six bytes: a body within the API's limit could then
// exceed the batch limit once stored. For the same reason U+2028 and U+2029,
// which encoding/json escapes whatever the option, are put back as the
// three bytes they were sent as (JSON allows them raw in strings).
func marshalNoHTML(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return unescapeLineSeparators(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), nil
}

// unescapeLineSeparators turns the \u2028 and \u2029 escapes of encoder
// output into raw characters. In encoder output every backslash starts an
// escape, so skipping escapes two bytes at a time is exact (a "\\u2028" is
// an escaped backslash followed by text).
func unescapeLineSeparators(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u202`)) {
		return b
	}
	out := b[:0:0]
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			out = append(out, b[i])
			continue
		}
		if i+5 < len(b) && b[i+1] == 'u' && b[i+2] == '2' && b[i+3] == '0' && b[i+4] == '2' && (b[i+5] == '8' || b[i+5] == '9') {
			out = append(out, 0xe2, 0x80, 0xa8+(b[i+5]-'8'))
			i += 5
			continue
		}
		out = append(out, b[i], b[i+1])
		i++
	}
	return out
}
