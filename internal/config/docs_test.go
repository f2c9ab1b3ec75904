package config

import (
	"path/filepath"
	"testing"

	"github.com/convlog/convlog/internal/doctest"
)

// The config examples of the docs are files convlog accepts.
func TestDocsConfigExamples(t *testing.T) {
	for _, ex := range []struct{ doc, heading string }{
		{"security.md", "Turning access control on"},
	} {
		code, err := doctest.Block(filepath.Join("..", "..", "docs", ex.doc), ex.heading, "yaml")
		if err != nil {
			t.Fatal(err)
		}
		f, err := Parse(ex.doc, []byte(code))
		if err != nil {
			t.Errorf("%s, %q: %v", ex.doc, ex.heading, err)
			continue
		}
		if f.Auth == nil || !f.Auth.Enabled() {
			t.Errorf("%s, %q: no access control in %+v", ex.doc, ex.heading, f)
		}
	}
}
