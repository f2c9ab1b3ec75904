package log

import (
	"fmt"
	"github.com/convlog/convlog/log/record"
	"strings"
)

// encode is the key's bbolt form. Names never contain 0x00, so the
// separators make it unambiguous.
func encodeKey(k record.Key) []byte {
	return []byte(k.Agent + "\x00" + k.Instance + "\x00" + k.Session)
}

func decodeKey(b []byte) (record.Key, error) {
	parts := strings.Split(string(b), "\x00")
	if len(parts) != 3 {
		return record.Key{}, fmt.Errorf("%w: stored key %q", ErrInvalidName, b)
	}
	k := record.Key{Agent: parts[0], Instance: parts[1], Session: parts[2]}
	return k, k.Validate()
}
