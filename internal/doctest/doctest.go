// Package doctest runs the examples of docs/ in tests: it finds a fenced
// code block under a heading of a Markdown file, and it finds python3
// (a failure, not a skip, when CI is set), so that an example in the docs
// is code that ran.
package doctest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Block returns the first fenced code block of language lang that follows
// the heading line starting with heading in the Markdown file at path.
func Block(path, heading, lang string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	lines := strings.Split(string(b), "\n")
	i := 0
	for ; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "#") && strings.HasPrefix(strings.TrimLeft(lines[i], "# "), heading) {
			break
		}
	}
	if i == len(lines) {
		return "", fmt.Errorf("%s: no heading %q", path, heading)
	}
	for ; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) == "```"+lang {
			var code []string
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
				code = append(code, lines[i])
			}
			return strings.Join(code, "\n") + "\n", nil
		}
	}
	return "", fmt.Errorf("%s: no ```%s block after heading %q", path, lang, heading)
}

// Python3 is the path of python3. Without it the test is skipped with a
// clear message, or fails when CI is set.
func Python3(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and python3 is missing: the docs' Python examples must run: %v", err)
		}
		t.Skipf("python3 not found: the docs' Python examples are not run (set CI to make this a failure): %v", err)
	}
	return p
}
