package record

import (
	"fmt"
	"strconv"
)

// Offset is a position in a stream, opaque to callers: compare offsets for
// equality, never order them. Start is the beginning of every stream.
//
// Today an offset is the decimal count of records before a batch. That is an
// implementation detail that clients must not rely on.
type Offset string

// Start is the offset of a stream's first batch.
const Start Offset = "0"

// maxOffsetLength is the longest decimal uint64.
const maxOffsetLength = 20

// OffsetOf is the offset of a position. Only the engine makes offsets.
func OffsetOf(pos uint64) Offset { return Offset(strconv.FormatUint(pos, 10)) }

// ParseOffset checks the form of an offset from outside: canonical decimal,
// no sign, no leading zeros, within uint64. It does not know whether a stream
// produced it; Read does.
func ParseOffset(s string) (Offset, error) {
	_, err := Offset(s).Position()
	return Offset(s), err
}

// Position is the engine's reading of an offset. Clients must not use it:
// offsets are opaque to them.
func (o Offset) Position() (uint64, error) {
	s := string(o)
	if s == "" || len(s) > maxOffsetLength || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%w: %q", ErrInvalidOffset, truncate(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: %q", ErrInvalidOffset, truncate(s))
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrInvalidOffset, truncate(s))
	}
	return n, nil
}
