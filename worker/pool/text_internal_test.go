package pool

import (
	"context"
	"strings"
	"testing"

	"github.com/convlog/convlog/log/record"
)

// A reply streamed in token-sized deltas is accumulated in linear time:
// allocations grow with the log of its size, not with its deltas (the
// part's string was copied whole on every delta: 95 s of CPU for 1 MB).
func TestTextDeltasAccumulateLinearly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		deltas int
	}{
		{"64k deltas", 1 << 16},
		{"256k deltas", 1 << 18},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(1, func() {
				tr := &turn{}
				for range tc.deltas {
					tr.appendText(record.PartText, "tok ")
				}
				tr.endText()
				if len(tr.parts) != 1 || len(tr.parts[0].Text) != 4*tc.deltas {
					t.Fatalf("parts %d, text %d bytes", len(tr.parts), len(tr.parts[0].Text))
				}
			})
			if allocs > 64 {
				t.Fatalf("%d deltas took %.0f allocations; want O(log n)", tc.deltas, allocs)
			}
		})
	}
}

// Text and reasoning alternating keep their order, each a part of its own.
func TestTextPartsKeepOrder(t *testing.T) {
	tr := &turn{}
	for _, d := range []struct{ typ, s string }{
		{record.PartReasoning, "th"}, {record.PartReasoning, "ink"}, {record.PartText, "a"}, {record.PartText, "b"}, {record.PartReasoning, "c"},
	} {
		tr.appendText(d.typ, d.s)
	}
	tr.endText()
	var got []string
	for _, p := range tr.parts {
		got = append(got, p.Type+":"+p.Text)
	}
	if want := "reasoning:think text:ab reasoning:c"; strings.Join(got, " ") != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// BenchmarkTextDeltas streams a 2 MB reply (one stored piece) in 4-byte
// deltas through addText.
func BenchmarkTextDeltas(b *testing.B) {
	const deltas = maxMessagePiece / 4
	b.SetBytes(maxMessagePiece)
	for b.Loop() {
		tr := &turn{}
		for range deltas - 1 {
			if err := tr.addText(context.Background(), record.PartText, "tok "); err != nil {
				b.Fatal(err)
			}
		}
		tr.endText()
	}
}
