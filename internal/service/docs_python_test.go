package service

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/doctest"
)

// The complete Python client of docs/protocol.md (section 8.2) runs against
// a live server: it delivers, tails the conversation over SSE and returns
// when its submission is settled.
func TestDocsPythonClient(t *testing.T) {
	py := doctest.Python3(t)
	code, err := doctest.Block(filepath.Join("..", "..", "docs", "protocol.md"), "8.2", "python")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "tail_client.py")
	if err := os.WriteFile(script, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	svc, _ := testService(t, func(c *Config) { c.EchoDelay = time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, script, "http://"+svc.Addr()).CombinedOutput()
	if err != nil {
		t.Fatalf("tail_client.py: %v\n%s", err, out)
	}
	for _, want := range []string{"202: {", "[user_message] Hello from Python, word by word.", "[assistant_message]", `"status": "completed"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
