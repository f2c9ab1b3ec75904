package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
)

// A follower that joins mid-turn misses the first deltas: the durable
// message is then printed whole, not as the tail the deltas showed.
func TestPrinterMissedDeltasShowTheWholeMessage(t *testing.T) {
	t.Parallel()
	assistant := func(text string) client.Update {
		p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
		return client.Update{Kind: client.UpdateBatch, Records: []record.Record{record.EntryRecord(record.Entry{Type: record.EntryAssistantMessage, Payload: p})}}
	}
	delta := func(s string) client.Update {
		b, _ := json.Marshal(map[string]string{"type": "delta", "kind": "text", "delta": s})
		return client.Update{Kind: client.UpdateDelta, DeltaType: "delta", Delta: b}
	}
	for name, tc := range map[string]struct {
		deltas []string
		want   string
	}{
		"all deltas seen":   {[]string{"hello ", "world"}, "assistant: hello world\n"},
		"first ones missed": {[]string{"world"}, "assistant: world\nassistant: hello world\n"},
		"no deltas":         {nil, "assistant: hello world\n"},
	} {
		var out strings.Builder
		p := &printer{out: &out}
		for _, d := range tc.deltas {
			p.update(delta(d))
		}
		p.update(assistant("hello world"))
		if out.String() != tc.want {
			t.Errorf("%s: printed %q, want %q", name, out.String(), tc.want)
		}
	}
}
