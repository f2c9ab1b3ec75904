package record

import (
	"errors"
	"unicode/utf8"
)

// Sentinel errors of the record types; the log package returns the same
// values, so errors.Is works with either name.
var (
	// ErrInvalidName: an agent, instance or session name outside the
	// allowed character set or length.
	ErrInvalidName = errors.New("invalid name")
	// ErrInvalidOffset: an offset string that is not of our making.
	ErrInvalidOffset = errors.New("invalid offset")
	// ErrInvalidRecord: a record or entry the engine refuses to store.
	ErrInvalidRecord = errors.New("invalid record")
)

// Clip shortens s, a value from outside quoted in an error message, to at
// most n bytes and an ellipsis, cut on a rune boundary so that the message
// stays valid UTF-8. Every package that quotes outside input clips with it.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for i := n; i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i] + "…"
		}
	}
	return "…"
}
