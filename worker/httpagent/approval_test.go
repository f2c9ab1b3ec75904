package httpagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/agenttest"
	"github.com/convlog/convlog/worker/agentwire"
	"github.com/convlog/convlog/worker/httpagent"
)

// An http agent asks with approval_requested and is invoked again with
// the decisions as the request's resume.
func TestApprovalRoundTrip(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req agentwire.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		if req.Resume == nil {
			fmt.Fprint(w, `{"type":"approval_requested","id":"c1","name":"refund","args":{"amount":5},"reason":"money"}`+"\n"+`{"type":"completed"}`+"\n")
			return
		}
		d := req.Resume.Decisions[0]
		text, _ := json.Marshal(fmt.Sprintf("%s %v %s %s", d.ApprovalID, d.Approved, d.Input, req.Prompt.Text))
		fmt.Fprintf(w, `{"type":"text","delta":%s}`+"\n"+`{"type":"completed"}`+"\n", text)
	}))
	defer srv.Close()
	a := &httpagent.Agent{URL: srv.URL}
	evs, err := agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "refund me"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Type != worker.EventApprovalRequested || evs[0].ID != "c1" || evs[0].Name != "refund" || string(evs[0].Args) != `{"amount":5}` || evs[0].Reason != "money" || evs[1].Type != worker.EventCompleted {
		t.Fatalf("%+v", evs)
	}
	resume := &worker.Resume{Decisions: []worker.Decision{{ApprovalID: "ap1", ToolCallID: "c1", ToolName: "refund", Args: evs[0].Args, Approved: true, Input: json.RawMessage(`{"amount":3}`)}}}
	evs, err = agenttest.Collect(context.Background(), a, worker.Scope{Session: "a/i/s"}, worker.Prompt{Text: "refund me", Resume: resume}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Delta != `ap1 true {"amount":3} refund me` {
		t.Fatalf("%+v", evs)
	}
}
