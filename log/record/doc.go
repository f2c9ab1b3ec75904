// Package record holds the wire and storage types of convlog's
// conversation streams: records (entries and truncations), message
// payloads, settlements, submissions, keys, offsets, incarnations and read
// pages. It imports no storage engine, so clients and the projection can
// use it without linking bbolt; package log stores these types and
// re-exports them under the same names.
package record
