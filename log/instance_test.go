package log_test

import (
	"path/filepath"
	"strings"
	"testing"

	clog "github.com/convlog/convlog/log"
)

// A log file keeps its instance id for life; another file has another.
func TestInstanceIDKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "convlog.db")
	db, err := clog.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := db.InstanceID()
	if !strings.HasPrefix(id, "ins_") || len(id) != len("ins_")+26 {
		t.Fatalf("instance id %q", id)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := clog.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.InstanceID() != id {
		t.Fatalf("reopened: %q, was %q", again.InstanceID(), id)
	}
	if other := openTestDB(t, nil); other.InstanceID() == id {
		t.Fatalf("two files share instance id %q", id)
	}
}
