package record

import (
	"encoding/json"
	"fmt"
)

// Batch is the unit of appending and reading: the records of one append, at
// one offset.
type Batch struct {
	Offset Offset `json:"offset"`
	// Count is the number of records.
	Count int `json:"-"`
	// Records is the JSON array of the records, exactly as stored; serving
	// it needs no decoding. Decode gives the typed records. It may be
	// shared with other readers: never modify it.
	Records RawRecords `json:"records"`
}

// RawRecords is a JSON array of records.
type RawRecords []byte

// MarshalJSON returns the stored array itself.
func (r RawRecords) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("[]"), nil
	}
	return r, nil
}

// UnmarshalJSON keeps a copy of the array.
func (r *RawRecords) UnmarshalJSON(b []byte) error {
	*r = append((*r)[:0], b...)
	return nil
}

// Decode parses the records.
func (r RawRecords) Decode() ([]Record, error) {
	var recs []Record
	if err := json.Unmarshal(r, &recs); err != nil {
		return nil, fmt.Errorf("decode records: %w", err)
	}
	return recs, nil
}
