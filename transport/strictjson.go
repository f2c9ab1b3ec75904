package transport

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport/wire"

	"github.com/convlog/convlog/log/record"
)

// checkStrictJSON refuses what encoding/json would silently alter: invalid
// UTF-8 and lone surrogate escapes become U+FFFD, the last of duplicate keys
// wins, and an out-of-range number is kept as text that a JavaScript reader
// parses as Infinity. It runs before decoding; syntax errors are left to the
// decoder, whose messages say where.
func checkStrictJSON(body []byte) error {
	if !utf8.Valid(body) {
		i := firstInvalidUTF8(body)
		return apiErr(http.StatusBadRequest, wire.CodeInvalidUTF8, "the body is not valid UTF-8 (at byte %d)", i)
	}
	if i := loneSurrogate(body); i >= 0 {
		return apiErr(http.StatusBadRequest, wire.CodeInvalidUTF8, `the body has a \u escape of a lone UTF-16 surrogate (at byte %d), which is not a character`, i)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	// One key set per open object; nil for an array.
	var stack []map[string]struct{}
	expectKey := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return nil // a syntax error: the decoder reports it with context
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, map[string]struct{}{})
				expectKey = true
				continue
			case '[':
				stack = append(stack, nil)
			case '}', ']':
				stack = stack[:len(stack)-1]
			}
		case string:
			if expectKey {
				keys := stack[len(stack)-1]
				if _, dup := keys[t]; dup {
					return apiErr(http.StatusBadRequest, wire.CodeDuplicateKey, "the key %q appears twice in one object (at byte %d)", record.Clip(t, 40), dec.InputOffset())
				}
				keys[t] = struct{}{}
				expectKey = false
				continue
			}
		case json.Number:
			if _, err := strconv.ParseFloat(string(t), 64); errors.Is(err, strconv.ErrRange) {
				return apiErr(http.StatusBadRequest, wire.CodeNumberOutOfRange, "the number %s is beyond the range of a 64-bit float (at byte %d)", record.Clip(string(t), 40), dec.InputOffset())
			}
		}
		// After a value inside an object comes a key again.
		expectKey = len(stack) > 0 && stack[len(stack)-1] != nil
	}
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// loneSurrogate finds a \uXXXX escape of a surrogate that is not a high one
// followed by a \u escape of a low one: encoding/json turns it into U+FFFD.
// A backslash inside a string is always an escape, and outside strings JSON
// has none, so a scan that skips escaped characters is exact.
func loneSurrogate(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			continue
		}
		if b[i+1] != 'u' {
			i++ // skip the escaped character (it may be a backslash)
			continue
		}
		r, ok := hex4(b, i+2)
		if !ok {
			i++
			continue
		}
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			if i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
				if lo, ok := hex4(b, i+8); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 11
					continue
				}
			}
			return i
		case r >= 0xDC00 && r <= 0xDFFF:
			return i
		}
		i += 5
	}
	return -1
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[at:at+4]), 16, 16)
	if err != nil {
		return 0, false
	}
	return rune(v), true
}

// marshalNoHTML encodes as the log stores: '<' stays one byte, not six.
func marshalNoHTML(v any) ([]byte, error) { return log.EncodeJSON(v) }
