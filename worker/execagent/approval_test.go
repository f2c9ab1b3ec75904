package execagent_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agenttest"
)

// An exec agent asks with approval_requested and is run again with the
// decisions as the request's resume.
func TestApprovalRoundTrip(t *testing.T) {
	a := script(t, `import json, sys
req = json.loads(sys.stdin.readline())
if "resume" not in req:
    print(json.dumps({"type": "approval_requested", "id": "c1", "name": "deploy", "args": {"env": "prod"}}))
else:
    d = req["resume"]["decisions"][0]
    print(json.dumps({"type": "text", "delta": "%s %s %s" % (d["toolCallId"], d["approved"], d.get("reason"))}))
print(json.dumps({"type": "completed"}))
`)
	evs, err := agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "deploy"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Type != worker.EventApprovalRequested || evs[0].ID != "c1" || evs[0].Name != "deploy" || string(evs[0].Args) != `{"env": "prod"}` {
		t.Fatalf("%+v", evs)
	}
	resume := &worker.Resume{Decisions: []worker.Decision{{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "deploy", Args: json.RawMessage(`{"env":"prod"}`), Reason: "timeout"}}}
	evs, err = agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "deploy", Resume: resume}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Delta != "c1 False timeout" {
		t.Fatalf("%+v", evs)
	}
}
