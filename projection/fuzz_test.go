package projection_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
)

// fuzzSeeds are small on purpose: the fuzzer minimizes every input that
// finds new coverage, and a large seed spends a short -fuzztime on that.
var fuzzSeeds = []string{
	`[]`,
	// A turn: question, answer, settlement.
	`[{"kind":"entry","entry":{"id":"u","type":"user_message","submissionId":"s","payload":{"parts":[{"type":"text","text":"hi"}]}}},` +
		`{"kind":"entry","entry":{"id":"a","parentId":"u","type":"assistant_message","turnId":"t","payload":{"parts":[{"type":"reasoning","text":"r"},{"type":"text","text":"yo"}]}}},` +
		`{"kind":"entry","entry":{"id":"x","parentId":"a","type":"settlement","payload":{"submissionId":"s","outcome":"completed"}}}]`,
	// A tool call, a failed result, a rewind, a rejoin.
	`[{"kind":"entry","entry":{"id":"a","type":"assistant_message","payload":{"parts":[{"type":"tool-call","toolCallId":"c","toolName":"t","input":{}}]}}},` +
		`{"kind":"entry","entry":{"id":"b","parentId":"a","type":"tool_result","payload":{"toolCallId":"c","isError":true,"output":"x"}}},` +
		`{"kind":"truncated","rewoundTo":"a","newLeafId":"a","reason":"r"},` +
		`{"kind":"entry","entry":{"id":"c","parentId":"b","type":"user_message","payload":{"parts":[{"type":"file","mediaType":"m","url":"u"}]}}}]`,
	// An edit: a branch from the start, hidden and diagnostic messages.
	`[{"kind":"entry","entry":{"id":"u","type":"user_message","payload":{"purpose":"dispatch","display":"hidden","parts":[]}}},` +
		`{"kind":"entry","entry":{"id":"a","parentId":"u","type":"assistant_message","payload":{"display":"diagnostic","parts":[{"type":"data","name":"n","data":1}]}}},` +
		`{"kind":"entry","entry":{"id":"v","type":"user_message","payload":{"parts":[]}}}]`,
	// What the engine never writes.
	`[{"kind":"checkpoint"},{"kind":"entry","entry":{"id":"a","parentId":"a","type":"x","payload":null}},` +
		`{"kind":"entry","entry":{"id":"a","parentId":"z","type":"user_message","payload":{"parts":[]}}},` +
		`{"kind":"truncated","rewoundTo":"z","newLeafId":""},` +
		`{"kind":"entry","entry":{"id":"s","type":"settlement","submissionId":"q","payload":{"outcome":"failed","error":{"message":"m"}}}}]`,
}

func FuzzProject(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		var records []record.Record
		if json.Unmarshal(data, &records) != nil {
			t.Skip()
		}
		all := projection.Project(records)
		if _, err := json.Marshal(all); err != nil {
			t.Fatalf("view does not marshal: %v", err)
		}
		p := projection.NewProjector()
		for i, r := range records {
			p.Apply(r)
			if i == len(records)/2 {
				if got, want := p.View(), projection.Project(records[:i+1]); !reflect.DeepEqual(got, want) {
					t.Fatalf("after %d records: incremental %s, project %s", i+1, jsonOf(t, got), jsonOf(t, want))
				}
			}
		}
		if got := p.View(); !reflect.DeepEqual(got, all) {
			t.Fatalf("incremental %s, project %s", jsonOf(t, got), jsonOf(t, all))
		}
		entries := 0
		for _, r := range records {
			if r.Kind == record.KindEntry {
				entries++
			}
		}
		if path := projection.ActivePath(records); len(path) > entries || len(all.Messages) > entries {
			t.Fatalf("%d entries, %d on the path, %d messages", entries, len(path), len(all.Messages))
		}
	})
}
