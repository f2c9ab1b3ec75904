package log

import (
	"github.com/oklog/ulid/v2"

	"github.com/convlog/convlog/log/record"
)

// The record types the log stores are package record's, which a reader
// imports without this storage engine.

func incarnationOf(id ulid.ULID) record.Incarnation {
	return record.Incarnation(record.IncarnationPrefix + id.String())
}
