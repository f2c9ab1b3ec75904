package deps

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArchitectureDoc keeps docs/architecture.md true to the tree: every
// package of the module is in its table, a package imports only those of
// its own row or rows below it, and every path the page names exists.
func TestArchitectureDoc(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)

	// The table of "## Packages": the first cell of each row names the
	// row's packages.
	sec := text[strings.Index(text, "## Packages"):]
	sec = sec[:strings.Index(sec[1:], "\n## ")+1]
	row := map[string]int{}
	tick := regexp.MustCompile("`([^`]+)`")
	n := 0
	for _, line := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range tick.FindAllStringSubmatch(first, -1) {
			row[m[1]] = n
		}
		n++
	}
	if n == 0 {
		t.Fatal("no table rows under ## Packages")
	}

	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		r, ok := row[pkg]
		if !ok {
			t.Errorf("package %s is not in the table of docs/architecture.md", pkg)
			continue
		}
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			dep := strings.TrimPrefix(imp, module+"/")
			if rd, ok := row[dep]; ok && rd < r {
				t.Errorf("%s (row %d) imports %s (row %d), which the table puts above it", pkg, r, dep, rd)
			}
		}
	}

	// Every path the page names: a package directory or a file.
	for _, m := range tick.FindAllStringSubmatch(text, -1) {
		p := m[1]
		if strings.ContainsAny(p, " ={}*") || !strings.Contains(p, "/") && !strings.HasSuffix(p, ".go") {
			continue
		}
		if !regexp.MustCompile(`^(cmd|internal|log|projection|transport|worker|docs)(/|$)`).MatchString(p) {
			if strings.HasSuffix(p, ".go") {
				// a bare file name: it must exist in some package the
				// page names
				if !fileInTable(root, row, p) {
					t.Errorf("docs/architecture.md names %s, which no package of its table holds", p)
				}
			}
			continue
		}
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("docs/architecture.md names %s: %v", p, err)
		}
	}
}

func fileInTable(root string, row map[string]int, name string) bool {
	for pkg := range row {
		if _, err := os.Stat(filepath.Join(root, pkg, name)); err == nil {
			return true
		}
	}
	return false
}
