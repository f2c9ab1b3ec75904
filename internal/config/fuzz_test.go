package config

import (
	"strings"
	"testing"
)

// FuzzParse: any bytes in a config file give a parsed file or an error
// that names the file, never a panic.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"agents:\n  - name: a\n    kind: echo\n",
		"agents:\n  - name: s\n    kind: openai\n    baseURL: http://x/v1\n    model: m\n",
		"agents:\n  - name: e\n    kind: exec\n    command: [\"python3\", \"a.py\"]\n",
		"auth:\n  tokens:\n    - sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n      principal: ops\n      scopes: [admin]\n",
		"agents: [",
		"unknown: 1\n",
		"agents:\n  - name: a\n    kind: echo\n    timeout: 10x\n",
		"agents:\n  - name: o\n    kind: openai\n    model: m\n    tools:\n      - name: t\n        url: http://x/\n        parameters:\n          a: &a [x, x, x, x]\n          b: &b [*a, *a, *a, *a]\n          c: &c [*b, *b, *b, *b]\n          d: [*c, *c, *c, *c]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := Parse("fuzz.yaml", b); err != nil && !strings.Contains(err.Error(), "fuzz.yaml") {
			t.Fatalf("error does not name the file: %v", err)
		}
	})
}
