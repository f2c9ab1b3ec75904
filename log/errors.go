package log

import (
	"errors"

	"github.com/convlog/convlog/log/record"
)

// Sentinel errors that callers branch on. ErrInvalidName, ErrInvalidOffset
// and ErrInvalidRecord are package record's. Returned errors wrap them with
// context; test with errors.Is.
var (
	ErrInvalidName   = record.ErrInvalidName
	ErrInvalidOffset = record.ErrInvalidOffset
	// ErrUnknownOffset: a well-formed offset that this stream's current
	// incarnation never produced.
	ErrUnknownOffset = errors.New("offset not produced by this stream")
	ErrInvalidRecord = record.ErrInvalidRecord
	// ErrBatchTooLarge: a batch whose stored form is over MaxBatchBytes. It
	// is also an ErrInvalidRecord; a producer that can split what it
	// writes branches on this one.
	ErrBatchTooLarge = errors.New("batch too large")
	// ErrUnknownEntry: a parent or truncation target that is not an entry
	// of the stream.
	ErrUnknownEntry = errors.New("unknown entry")
	// ErrDuplicateEntry: an entry id the stream already holds.
	ErrDuplicateEntry = errors.New("duplicate entry id")
	// ErrSubmissionNotFound: no submission has that id.
	ErrSubmissionNotFound = errors.New("submission not found")
	// ErrSubmissionSettled: the submission already has its terminal outcome.
	ErrSubmissionSettled = errors.New("submission already settled")
	// ErrSubmissionState: a status change the submission's state forbids
	// (starting a running submission, settling one of another stream).
	ErrSubmissionState = errors.New("submission state forbids this")
	// ErrNotWaiting: a decision for a submission that is not waiting for
	// one (not input_required, or every request decided already).
	ErrNotWaiting = errors.New("submission not waiting for input")
	// ErrUnknownApproval: a decision naming an approval the waiting
	// submission did not request.
	ErrUnknownApproval = errors.New("unknown approval")
	// ErrAlreadyDecided: a decision on an approval decided before; the
	// first decision stands.
	ErrAlreadyDecided = errors.New("approval already decided")
	// ErrIdempotencyKeyReused: an idempotency key seen before with a
	// different request body.
	ErrIdempotencyKeyReused = errors.New("idempotency key reused with another request")
	// ErrSessionBusy: an admission with RejectIfBusy to a session that has
	// unsettled submissions.
	ErrSessionBusy = errors.New("session busy")
	// ErrTurnLimit: an admission (or a regenerate) with MaxTurns to a
	// session that has had that many.
	ErrTurnLimit = errors.New("turn limit reached")
	// ErrIncarnationChanged: a write that expected an incarnation the
	// stream no longer has (it was reset).
	ErrIncarnationChanged = errors.New("stream incarnation changed")
	// ErrStaleGeneration: a delivery that names a generation uid the
	// instance no longer has (see StaleGenerationError).
	ErrStaleGeneration = errors.New("stale generation")
	// ErrNotOnPath: a rewind, regenerate or fork to an entry that is not
	// a user message on the active path.
	ErrNotOnPath = errors.New("entry not on the active path")
	// ErrConflict: a fork into a conversation that exists.
	ErrConflict = errors.New("conversation exists")
	// ErrInstanceNotFound: no instance of that name (or it was deleted).
	ErrInstanceNotFound = errors.New("instance not found")
	// ErrClosed: the database is closed.
	ErrClosed = errors.New("log closed")
	// ErrCorrupt: the file is damaged (a bad meta page, a truncated file,
	// a page bbolt panicked on). Restore from a backup.
	ErrCorrupt = errors.New("log file damaged")
	// ErrNoSpace: a write failed because the file system is full (ENOSPC)
	// or the quota is exhausted (EDQUOT). Nothing of it was stored; it
	// succeeds again once there is space.
	ErrNoSpace = errors.New("no space left for the log")
)
