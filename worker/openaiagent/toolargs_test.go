package openaiagent_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/openaiagent"
	"github.com/convlog/convlog/worker/openaiagent/fakeopenai"
)

// Tool-call arguments are bounded as they stream, at the log's batch
// limit, in one call or across calls: 200 MB of fragments took RSS to
// 2.2 GB before the pool refused the reply. The tool is never called.
func TestToolArgumentsBoundedAsTheyStream(t *testing.T) {
	const frag = 256 << 10
	piece := strings.Repeat("a", frag)
	n := record.MaxBatchBytes/frag + 8
	for _, tc := range []struct {
		name  string
		calls int
	}{
		{"one call", 1},
		{"many calls", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var called atomic.Bool
			tool := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called.Store(true); io.WriteString(w, `{}`) }))
			defer tool.Close()
			var chunks []fakeopenai.Chunk
			for i := range n {
				d := fakeopenai.ToolCallDelta{Index: i % tc.calls, Arguments: piece}
				if i < tc.calls {
					d.ID, d.Name, d.Arguments = fmt.Sprintf("c%d", i), "t", `{"x":"`+piece
				}
				chunks = append(chunks, fakeopenai.Chunk{ToolCalls: []fakeopenai.ToolCallDelta{d}})
			}
			srv := fakeopenai.New(fakeopenai.Response{Chunks: chunks})
			defer srv.Close()
			a := agent(srv, userHistory("x"))
			a.Tools = []openaiagent.Tool{{Name: "t", URL: tool.URL}}
			evs := collect(t, a)
			streamed := 0
			for _, ev := range evs {
				switch ev.Type {
				case worker.EventToolInputDelta:
					streamed += len(ev.Delta)
				case worker.EventToolStarted:
					t.Fatalf("a tool call of %d bytes was started", len(ev.Args))
				}
			}
			if l := evs[len(evs)-1]; l.Code != openaiagent.CodeReplyTooLarge || l.Retryable {
				t.Fatalf("last event %+v", l)
			}
			if streamed > record.MaxBatchBytes {
				t.Fatalf("%d bytes of arguments taken; want at most %d", streamed, record.MaxBatchBytes)
			}
			if called.Load() {
				t.Fatal("the tool was called")
			}
		})
	}
}
