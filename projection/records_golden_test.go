package projection_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestGoldenRecords pins the input of each golden view as wire JSON
// (testdata/NAME.records.json), so that a projection written in another
// language (the JS client's port, transport/jsclient) can be checked against
// the same records and the same expected views (testdata/NAME.golden).
func TestGoldenRecords(t *testing.T) {
	for name, records := range goldenConversations {
		t.Run(name, func(t *testing.T) {
			got, err := json.MarshalIndent(records, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", name+".records.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("records of %s differ from %s (run with -update if the change is intended):\n%s", name, path, got)
			}
		})
	}
}
