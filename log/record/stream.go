package record

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/oklog/ulid/v2"
)

// Incarnation identifies a stream's producer generation. It changes when the
// stream is reset; offsets of one incarnation mean nothing in another.
type Incarnation string

// IncarnationPrefix begins every incarnation.
const IncarnationPrefix = "inc_"

// ReadResult is a page of a stream.
type ReadResult struct {
	// Incarnation is empty (JSON null) for a stream that does not exist.
	Incarnation Incarnation `json:"incarnation"`
	Batches     []Batch     `json:"batches"`
	// NextOffset is where the next read continues.
	NextOffset Offset `json:"nextOffset"`
	// UpToDate is true when the read reached the tail.
	UpToDate bool `json:"upToDate"`
	// Remaining is how many records followed NextOffset when the read was
	// made: how far behind the tail the reader still is. Servers use it to
	// notice a live reader that falls behind; it is not on the wire.
	Remaining uint64 `json:"-"`
}

// MarshalJSON writes the empty incarnation as null.
func (i Incarnation) MarshalJSON() ([]byte, error) {
	if i == "" {
		return []byte("null"), nil
	}
	return json.Marshal(string(i))
}

// UnmarshalJSON reads null as the empty incarnation.
func (i *Incarnation) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		*i = ""
		return nil
	}
	return json.Unmarshal(b, (*string)(i))
}

// ParseIncarnation checks the form of an incarnation from outside.
func ParseIncarnation(s string) (Incarnation, error) {
	if len(s) != len(IncarnationPrefix)+ulid.EncodedSize || s[:len(IncarnationPrefix)] != IncarnationPrefix {
		return "", fmt.Errorf("invalid incarnation %q", truncate(s))
	}
	if _, err := ulid.ParseStrict(s[len(IncarnationPrefix):]); err != nil {
		return "", fmt.Errorf("invalid incarnation %q: %w", truncate(s), err)
	}
	return Incarnation(s), nil
}
