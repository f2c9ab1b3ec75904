package projection_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/convlog/convlog/internal/doctest"
	"github.com/convlog/convlog/projection"
)

// The Python projector of docs/protocol.md (section 7.2) must give the Go
// projection's view on the golden conversations.
func TestDocsPythonProjector(t *testing.T) {
	py := doctest.Python3(t)
	code, err := doctest.Block(filepath.Join("..", "docs", "protocol.md"), "7.2", "python")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "project.py")
	harness := code + "\nif __name__ == \"__main__\":\n    import sys\n    print(json.dumps(project(json.load(sys.stdin))))\n"
	if err := os.WriteFile(script, []byte(harness), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, records := range goldenConversations {
		t.Run(name, func(t *testing.T) {
			in, err := json.Marshal(records)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(py, script)
			cmd.Stdin = bytes.NewReader(in)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("python: %v\n%s", err, stderr.String())
			}
			goJSON, err := json.Marshal(projection.Project(records))
			if err != nil {
				t.Fatal(err)
			}
			var got, want any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("python output: %v\n%s", err, out)
			}
			if err := json.Unmarshal(goJSON, &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("the Python projector differs from projection.Project:\npython: %s\ngo:     %s", out, goJSON)
			}
		})
	}
}
