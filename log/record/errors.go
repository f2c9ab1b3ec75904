package record

import "errors"

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
