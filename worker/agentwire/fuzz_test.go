package agentwire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/convlog/convlog/worker"
)

// FuzzRead feeds arbitrary agent output in both formats: Read never
// panics, yields nothing after a terminal, and every error it makes of the
// agent's bytes is a protocol error.
func FuzzRead(f *testing.F) {
	for _, s := range []string{
		"{\"type\":\"text\",\"delta\":\"hi\"}\n{\"type\":\"completed\"}\n",
		"data: {\"type\":\"failed\",\"details\":\"x\",\"code\":\"c\"}\n\n",
		"{\"type\":\"text\"\n",
		"\n\n{\"type\":\"x-custom\",\"n\":1}\n",
		"data: {\"type\":\"completed\"}\ndata: trailing\n\n",
		"{}",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, b []byte, sse bool) {
		format := NDJSON
		if sse {
			format = SSE
		}
		after := false
		sawTerminal := false
		terminal, err := Read(bytes.NewReader(b), format, func(ev worker.Event) bool {
			if sawTerminal {
				after = true
			}
			if ev.Type == worker.EventCompleted || ev.Type == worker.EventFailed {
				sawTerminal = true
			}
			return true
		})
		if after {
			t.Fatal("an event was yielded after a terminal")
		}
		if err != nil && !errors.Is(err, ErrProtocol) {
			t.Fatalf("error %v is not ErrProtocol", err)
		}
		if terminal != sawTerminal {
			t.Fatalf("Read reports terminal=%v, yielded terminal=%v", terminal, sawTerminal)
		}
	})
}
