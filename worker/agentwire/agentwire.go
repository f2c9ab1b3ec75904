// Package agentwire is the wire form shared by the agent kinds that run
// outside convlog (http, exec): the request convlog sends, and the reader
// of the events that come back, one JSON object per line (NDJSON) or per
// SSE data field.
package agentwire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/convlog/convlog/worker"
)

// Request is what convlog sends for one turn. Resume is set when the turn
// resumes a submission whose tool calls the agent asked to have approved
// (an approval_requested event): {"decisions": [...]}, one per call.
type Request struct {
	Scope  worker.Scope   `json:"scope"`
	Prompt worker.Prompt  `json:"prompt"`
	Resume *worker.Resume `json:"resume,omitempty"`
}

// NewRequest is the request of a turn: prompt.Resume goes in Resume.
func NewRequest(scope worker.Scope, prompt worker.Prompt) Request {
	return Request{Scope: scope, Prompt: prompt, Resume: prompt.Resume}
}

// MaxLine bounds one event's encoding: a longer line, or an SSE event
// whose data lines together are longer, is a protocol error, not an
// unbounded buffer.
const MaxLine = 8 << 20

// ErrProtocol is wrapped by every error in what the agent sent.
var ErrProtocol = errors.New("agent protocol")

// ErrNoTerminal is wrapped (with ErrProtocol) by the error of a stream
// that ended without a terminal event.
var ErrNoTerminal = errors.New("no terminal event")

// Format of an event stream.
type Format int

// Formats.
const (
	NDJSON Format = iota // one JSON object per line; blank lines skipped
	SSE                  // text/event-stream: one JSON object per event's data
)

// Read reads events from r and yields each, with Raw set to the bytes as
// received, until a terminal (which it yields, then returns nil), the
// end of r (an error wrapping ErrProtocol: no terminal), a malformed
// event (ErrProtocol, naming its line) or yield returning false (nil).
// A read error of r is returned as is.
func Read(r io.Reader, f Format, yield func(worker.Event) bool) (terminal bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
	line := 0
	var data []byte // SSE: the data of the event being read
	dataLine := 0
	emit := func(b []byte, at int) (stop bool, err error) {
		ev, err := decode(b, at)
		if err != nil {
			return true, err
		}
		if !yield(ev) {
			return true, nil
		}
		if ev.Type == worker.EventCompleted || ev.Type == worker.EventFailed {
			terminal = true
			return true, nil
		}
		return false, nil
	}
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if f == NDJSON {
			if len(bytes.TrimSpace(b)) == 0 {
				continue
			}
			if stop, err := emit(bytes.Clone(b), line); stop {
				return terminal, err
			}
			continue
		}
		b = bytes.TrimSuffix(b, []byte("\r"))
		switch {
		case len(b) == 0: // end of an SSE event
			if data != nil {
				d := data
				data = nil
				if string(d) == "[DONE]" {
					continue
				}
				if stop, err := emit(d, dataLine); stop {
					return terminal, err
				}
			}
		case b[0] == ':': // comment
		default:
			field, value, _ := bytes.Cut(b, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			if string(field) == "data" {
				if data == nil {
					data, dataLine = []byte{}, line
				} else {
					data = append(data, '\n')
				}
				if len(data)+len(value) > MaxLine {
					return false, fmt.Errorf("%w: the event starting at line %d is longer than %d bytes by line %d", ErrProtocol, dataLine, MaxLine, line)
				}
				data = append(data, value...)
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return false, fmt.Errorf("%w: line %d is longer than %d bytes", ErrProtocol, line+1, MaxLine)
		}
		return false, err
	}
	if data != nil {
		if stop, err := emit(data, dataLine); stop {
			return terminal, err
		}
	}
	return false, fmt.Errorf("%w: %w: the stream ended after %d lines without a completed or failed event", ErrProtocol, ErrNoTerminal, line)
}

func decode(b []byte, line int) (worker.Event, error) {
	var ev worker.Event
	if err := json.Unmarshal(b, &ev); err != nil {
		return ev, fmt.Errorf("%w: line %d is not a JSON event: %v", ErrProtocol, line, err)
	}
	if ev.Type == "" {
		return ev, fmt.Errorf("%w: line %d: an event needs a \"type\"", ErrProtocol, line)
	}
	ev.Raw = b
	return ev, nil
}

// FormatOf picks the format of a response by its Content-Type.
func FormatOf(contentType string) Format {
	if strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "text/event-stream") {
		return SSE
	}
	return NDJSON
}

// ProtocolFailure is the failed event of a protocol error. A stream cut
// short may succeed another time (retryable, as the pool's own
// agent_protocol); a malformed event will not.
func ProtocolFailure(err error) worker.Event {
	return worker.Failed(err.Error(), errors.Is(err, ErrNoTerminal), CodeAgentProtocol)
}

// Codes of failures the out-of-process kinds report.
const (
	CodeAgentProtocol    = "agent_protocol"    // what the agent sent breaks the contract
	CodeAgentUnavailable = "agent_unavailable" // unreachable, or 5xx/429
	CodeAgentRejected    = "agent_rejected"    // a 4xx answer
	CodeAgentStart       = "agent_start"       // the program could not be started
)
