package remote

import (
	"bytes"
	"encoding/gob"
	"errors"
	"fmt"
	"strings"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/pool"
)

// Operations, one request subject each (natsbus.Namespace.LogSubject).
const (
	opSubmission = "submission"
	opPending    = "pending"
	opUnsettled  = "unsettled"
	opRead       = "read"
	opTail       = "tail"
	opWrite      = "write"
	opInstance   = "instance"
)

// ErrFenced: the write's session lease no longer names its writer. The
// turn must stop: another worker may run the session now.
var ErrFenced = errors.New("session lease not held by the writer (fenced)")

// ErrNotLeaseHolder: a read of a conversation, or a write to it, from a
// process that does not hold its session lease. A write so refused is
// also ErrFenced.
var ErrNotLeaseHolder = errors.New("not the holder of the session lease")

// ErrTooLarge: a request or its answer exceeds the broker's max_payload
// (a record larger than it, docs/scale-out.md). Not retried.
var ErrTooLarge = errors.New("larger than the broker's max_payload")

// errUnavailable: the owner could not check or commit for a passing
// reason (its broker in a leader election, the log closing); retried.
var errUnavailable = errors.New("log owner unavailable")

// request and response travel gob-encoded: the log's types carry fields
// (a submission's key, a batch's count) that their JSON forms leave out.
type request struct {
	ID     string
	Key    record.Key
	Offset record.Offset
	Limit  int
	Cursor clog.ScanCursor
	Write  clog.Write
	Fence  pool.Fence
}

type response struct {
	Err      []string // codes of the sentinels the error wraps
	Message  string
	Sub      record.Submission
	Subs     []record.Submission
	Cursor   clog.ScanCursor
	Read     record.ReadResult
	Inc      record.Incarnation
	Offset   record.Offset
	Appended clog.Appended
	Instance string
}

// sentinels are the errors callers of the log branch on, by wire code.
var sentinels = map[string]error{
	"invalid_name":         clog.ErrInvalidName,
	"invalid_offset":       clog.ErrInvalidOffset,
	"unknown_offset":       clog.ErrUnknownOffset,
	"invalid_record":       clog.ErrInvalidRecord,
	"batch_too_large":      clog.ErrBatchTooLarge,
	"unknown_entry":        clog.ErrUnknownEntry,
	"duplicate_entry":      clog.ErrDuplicateEntry,
	"submission_not_found": clog.ErrSubmissionNotFound,
	"submission_settled":   clog.ErrSubmissionSettled,
	"submission_state":     clog.ErrSubmissionState,
	"incarnation_changed":  clog.ErrIncarnationChanged,
	"closed":               clog.ErrClosed,
	"fenced":               ErrFenced,
	"not_lease_holder":     ErrNotLeaseHolder,
	"too_large":            ErrTooLarge,
	"unavailable":          errUnavailable,
}

func encode(v any) []byte {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(v); err != nil {
		// Only a type gob cannot carry, which is a bug here.
		panic(fmt.Sprintf("remote: encode %T: %v", v, err))
	}
	return b.Bytes()
}

func decode(data []byte, v any) error {
	if err := gob.NewDecoder(bytes.NewReader(data)).Decode(v); err != nil {
		return fmt.Errorf("remote: decode %T: %w", v, err)
	}
	return nil
}

// setErr puts err on the wire with the codes of every sentinel it wraps.
func (r *response) setErr(err error) {
	if err == nil {
		return
	}
	r.Message = err.Error()
	for code, s := range sentinels {
		if errors.Is(err, s) {
			r.Err = append(r.Err, code)
		}
	}
	if len(r.Err) == 0 {
		r.Err = []string{"internal"}
	}
}

// wireError is an error from the owner: its message, and errors.Is true of
// each sentinel it wrapped there.
type wireError struct {
	msg  string
	errs []error
}

func (e *wireError) Error() string   { return "log owner: " + e.msg }
func (e *wireError) Unwrap() []error { return e.errs }

func (r *response) err() error {
	if len(r.Err) == 0 {
		return nil
	}
	e := &wireError{msg: r.Message}
	for _, c := range r.Err {
		if s := sentinels[c]; s != nil {
			e.errs = append(e.errs, s)
		}
	}
	return e
}

// subjectOp is the operation of a request subject "<ns>.log.<op>".
func subjectOp(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}
