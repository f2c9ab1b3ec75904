package log

import (
	"fmt"
	"strings"
)

// encode is the key's bbolt form. Names never contain 0x00, so the
// separators make it unambiguous.
func encodeKey(k Key) []byte {
	return []byte(k.Agent + "\x00" + k.Instance + "\x00" + k.Session)
}

func decodeKey(b []byte) (Key, error) {
	parts := strings.Split(string(b), "\x00")
	if len(parts) != 3 {
		return Key{}, fmt.Errorf("%w: stored key %q", ErrInvalidName, b)
	}
	k := Key{Agent: parts[0], Instance: parts[1], Session: parts[2]}
	return k, k.Validate()
}
