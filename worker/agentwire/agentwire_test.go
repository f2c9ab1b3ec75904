package agentwire

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/convlog/convlog/worker"
)

// endless is an SSE stream of data lines that never ends an event.
type endless struct {
	line []byte
	off  int
	read int64
}

func (e *endless) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], e.line[e.off:])
		n += c
		e.off = (e.off + c) % len(e.line)
	}
	e.read += int64(n)
	return n, nil
}

// An SSE event is bounded as a line is: data lines without a blank line
// between them stop at MaxLine, not at the end of the stream (200 MB of
// them took RSS to 738 MB).
func TestSSEEventIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
	}{
		{"short lines", "data: x\n"},
		{"long lines", "data: " + strings.Repeat("y", 64<<10) + "\n"},
		{"crlf", "data: " + strings.Repeat("z", 1000) + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &endless{line: []byte(tc.line)}
			_, err := Read(io.LimitReader(r, 16*MaxLine), SSE, func(worker.Event) bool { return true })
			if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "longer than") {
				t.Fatalf("err = %v, want a protocol error naming the bound", err)
			}
			// What is read before the refusal is the bound, with each
			// line's framing ("data: ", line ends), and the reader's buffer.
			value := len(strings.TrimRight(strings.TrimPrefix(tc.line, "data: "), "\r\n"))
			if limit := int64(MaxLine)*int64(len(tc.line))/int64(value+1) + 256<<10; r.read > limit {
				t.Fatalf("read %d bytes before refusing; want at most %d", r.read, limit)
			}
		})
	}
}

// An event just under the bound, over several lines, is read.
func TestSSEEventUnderTheBound(t *testing.T) {
	big := strings.Repeat("a", MaxLine-64)
	stream := "data: {\"type\":\"text\",\ndata: \"delta\":\"" + big + "\"}\n\ndata: {\"type\":\"completed\"}\n\n"
	var got []worker.Event
	terminal, err := Read(strings.NewReader(stream), SSE, func(ev worker.Event) bool { got = append(got, ev); return true })
	if err != nil || !terminal || len(got) != 2 {
		t.Fatalf("terminal %v, err %v, %d events", terminal, err, len(got))
	}
}
