package projection_test

import (
	"fmt"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
)

// benchConversation is n records of turns as an agent writes them: a user
// message, a tool call, its result, an answer and a settlement.
func benchConversation(n int) []record.Record {
	records := make([]record.Record, 0, n)
	leaf := ""
	add := func(r record.Record) {
		if len(records) < n {
			records = append(records, r)
			leaf = r.Entry.ID
		}
	}
	for turn := 0; len(records) < n; turn++ {
		sub, call := fmt.Sprintf("sub_%d", turn), fmt.Sprintf("call_%d", turn)
		add(withSub(user(fmt.Sprintf("u%d", turn), leaf, text("What's the weather in Paris today?")), sub, ""))
		add(withSub(assistant(fmt.Sprintf("a%d", turn), leaf, record.Part{Type: record.PartReasoning, Text: "Need the forecast."}, toolCall(call, "weather", `{"city":"Paris"}`)), sub, "t"))
		add(withSub(toolResult(fmt.Sprintf("r%d", turn), leaf, call, false, `{"tempC":21,"sky":"clear"}`), sub, "t"))
		add(withSub(assistant(fmt.Sprintf("b%d", turn), leaf, text("It is 21°C and clear in Paris.")), sub, "t"))
		add(withSub(settlement(fmt.Sprintf("s%d", turn), leaf, record.Settlement{SubmissionID: sub, Outcome: record.OutcomeCompleted}), sub, ""))
	}
	return records
}

func BenchmarkProjectorApply(b *testing.B) {
	records := benchConversation(10_000)
	b.ReportAllocs()
	loops := 0
	for b.Loop() {
		p := projection.NewProjector()
		for _, r := range records {
			p.Apply(r)
		}
		loops++
	}
	b.ReportMetric(float64(loops*len(records))/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkProjectorView is the price of a view of the same conversation: a
// deep copy, paid per View call rather than per record.
func BenchmarkProjectorView(b *testing.B) {
	p := projection.NewProjector()
	p.Apply(benchConversation(10_000)...)
	b.ReportAllocs()
	for b.Loop() {
		_ = p.View()
	}
}
