package log

import "github.com/convlog/convlog/log/record"

// EncodeJSON is json.Marshal as the log stores records (record.EncodeJSON):
// for payloads built outside the log (a delivery's message), so that they
// keep their size too.
func EncodeJSON(v any) ([]byte, error) { return record.EncodeJSON(v) }

func marshalNoHTML(v any) ([]byte, error) { return record.EncodeJSON(v) }
