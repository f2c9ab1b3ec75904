package transport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// A write refused for want of disk space answers 507 insufficient_storage
// (JSON), not 500 internal: the client did nothing wrong and may retry.
// The real full disk is TestServeStorageFaults/full_disk (cmd/convlog);
// here the abort's settlement reports it.
func TestNoSpaceIs507(t *testing.T) {
	e := newEnv(t, func(o *envConfig) {
		o.Abort = func(context.Context, string) (record.Submission, error) {
			return record.Submission{}, fmt.Errorf("abort: commit: %w: write convlog.db: no space left on device", log.ErrNoSpace)
		}
	})
	status, _, b := e.postJSON(t, "/agents/echo/i", `{"session":"s","message":"hi"}`, nil)
	if status != http.StatusAccepted {
		t.Fatalf("deliver: %d %s", status, b)
	}
	var acc wire.Accepted
	if err := json.Unmarshal(b, &acc); err != nil {
		t.Fatal(err)
	}
	id := acc.SubmissionID
	status, h, b := e.do(t, "POST", "/agents/echo/i/submissions/"+id+"/abort", nil, nil)
	if status != http.StatusInsufficientStorage || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		t.Fatalf("abort on a full disk: %d %s %s", status, h.Get("Content-Type"), b)
	}
	if e := errorOf(t, b); e["code"] != wire.CodeInsufficientStorage {
		t.Fatalf("body: %s", b)
	}
}
