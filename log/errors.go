package log

import "errors"

// Sentinel errors that callers branch on. Returned errors wrap them with
// context; test with errors.Is.
var (
	// ErrInvalidName: an agent, instance or session name outside the
	// allowed character set or length.
	ErrInvalidName = errors.New("invalid name")
	// ErrInvalidOffset: an offset string that is not of our making.
	ErrInvalidOffset = errors.New("invalid offset")
	// ErrUnknownOffset: a well-formed offset that this stream's current
	// incarnation never produced.
	ErrUnknownOffset = errors.New("offset not produced by this stream")
	// ErrInvalidRecord: a record or entry the engine refuses to store.
	ErrInvalidRecord = errors.New("invalid record")
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
	// ErrIdempotencyKeyReused: an idempotency key seen before with a
	// different request body.
	ErrIdempotencyKeyReused = errors.New("idempotency key reused with another request")
	// ErrSessionBusy: an admission with RejectIfBusy to a session that has
	// unsettled submissions.
	ErrSessionBusy = errors.New("session busy")
	// ErrIncarnationChanged: a write that expected an incarnation the
	// stream no longer has (it was reset).
	ErrIncarnationChanged = errors.New("stream incarnation changed")
	// ErrClosed: the database is closed.
	ErrClosed = errors.New("log closed")
)
