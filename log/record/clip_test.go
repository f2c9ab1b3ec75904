package record_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/convlog/convlog/log/record"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 40, "short"},
		{strings.Repeat("a", 40), 40, strings.Repeat("a", 40)},
		{strings.Repeat("a", 41), 40, strings.Repeat("a", 40) + "…"},
		// "é" is two bytes: a cut at byte 3 of "aéé" falls inside the
		// second "é" and moves back to its start.
		{"aéé", 4, "aé…"},
		{"aéé", 2, "a…"},
		{"ééé", 1, "…"},
	} {
		got := record.Clip(tc.in, tc.n)
		if got != tc.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("Clip(%q, %d) = %q is not valid UTF-8", tc.in, tc.n, got)
		}
	}
}
