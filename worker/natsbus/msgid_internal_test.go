package natsbus

import (
	"testing"

	"github.com/convlog/convlog/log/record"
)

// An admission keeps one id whatever its status when relayed; each wait's
// resumption has its own, distinct from its admission's.
func TestMsgID(t *testing.T) {
	asked := []record.Approval{{ApprovalRequest: record.ApprovalRequest{ApprovalID: "apr_1"}, Decided: true}}
	for _, c := range []struct {
		name string
		sub  record.Submission
		want string
	}{
		{"admitted", record.Submission{ID: "sub_1", Status: record.StatusAdmitted}, "sub_1"},
		{"started in its admission", record.Submission{ID: "sub_1", Status: record.StatusRunning, TurnID: "turn_a"}, "sub_1"},
		{"settled before the relay", record.Submission{ID: "sub_1", Status: record.StatusCompleted, TurnID: "turn_a"}, "sub_1"},
		{"resumable after turn_a asked", record.Submission{ID: "sub_1", Status: record.StatusInputRequired, TurnID: "turn_a", Approvals: asked}, "sub_1#resume.turn_a"},
	} {
		if got := msgID(c.sub); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
