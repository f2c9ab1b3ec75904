package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agenttest"
)

func TestEchoConformance(t *testing.T) {
	long := worker.Prompt{Text: strings.Repeat("word ", 100)}
	agenttest.Run(t, worker.Echo{Delay: 5 * time.Millisecond}, agenttest.Options{
		Prompt:     worker.Prompt{Text: "hello there\n/think hmm\n/tool lookup {\"q\":1}\n/retry 1"},
		Long:       &long,
		Unknown:    &worker.Prompt{Text: `/event {"type":"x-progress","pct":50}`},
		UnknownRaw: json.RawMessage(`{"type":"x-progress","pct":50}`),
	})
}

func TestEchoCommands(t *testing.T) {
	text := "hi you\n/think let me see\n/tool search {\"q\":\"go\"}\n/toolerror boom {}\n/retry 2\n/event {\"type\":\"x\",\"n\":1}\nbye\n/fail quota_exceeded out of quota\nnot reached"
	evs, err := agenttest.Collect(context.Background(), worker.Echo{}, worker.Scope{}, worker.Prompt{Text: text}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	want := "text text thinking thinking thinking tool_started tool_ended tool_started tool_ended retrying retrying x text failed"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	if evs[0].Delta+evs[1].Delta != "hi you\n" || evs[2].Delta != "let " {
		t.Fatalf("deltas %+v", evs[:3])
	}
	if string(evs[5].Args) != `{"q":"go"}` || string(evs[6].Content) != `{"echo":{"q":"go"}}` || evs[6].IsError || !evs[8].IsError {
		t.Fatalf("tools %+v", evs[5:9])
	}
	if evs[9].Attempt != 1 || evs[10].Attempt != 2 || evs[10].MaxAttempts != 3 {
		t.Fatalf("retrying %+v", evs[9:11])
	}
	if string(evs[11].Raw) != `{"type":"x","n":1}` {
		t.Fatalf("raw %s", evs[11].Raw)
	}
	last := evs[len(evs)-1]
	if last.Code != "quota_exceeded" || last.Details != "out of quota" || last.Retryable {
		t.Fatalf("failed %+v", last)
	}
	// Without commands, the deltas are the prompt, exactly.
	plain := "a  b\n\nc /notacommand d"
	evs, _ = agenttest.Collect(context.Background(), worker.Echo{}, worker.Scope{}, worker.Prompt{Text: plain}, 10*time.Second)
	var b strings.Builder
	for _, ev := range evs[:len(evs)-1] {
		b.WriteString(ev.Delta)
	}
	if b.String() != plain || evs[len(evs)-1].Type != worker.EventCompleted {
		t.Fatalf("plain echo %q", b.String())
	}
}

// An /event that is itself a terminal ends the turn: nothing after it.
func TestEchoTerminalEventEndsTheTurn(t *testing.T) {
	evs, err := agenttest.Collect(context.Background(), worker.Echo{}, worker.Scope{}, worker.Prompt{Text: "/event {\"type\":\"completed\"}\nnot reached"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Type != worker.EventCompleted {
		t.Fatalf("events %+v, want just the completed event", evs)
	}
}
