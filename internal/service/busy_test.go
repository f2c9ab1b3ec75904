package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/internal/servicetest"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

const busyAgents = `agents:
  - {name: joiner, kind: echo, busy: join}
  - {name: queuer, kind: echo, busy: queue}
  - {name: rejecter, kind: echo, busy: reject}
  - {name: interrupter, kind: echo, busy: interrupt}
  - {name: legacy, kind: echo, busy: enqueue}
  - {name: slowpoke, kind: echo, timeout: 200ms}
  - {name: limited, kind: echo, maxTurns: 2}
`

// threeQuickPOSTs delivers three messages to one session while the first
// is still running (it sleeps first, an echo command), and returns what
// each POST got.
func threeQuickPOSTs(t *testing.T, c *client.Client, agent string) (accs []wire.Accepted, errs []error) {
	t.Helper()
	for i, text := range []string{"/sleep 1s\nfirst", "/sleep 1s\nsecond", "third"} {
		acc, err := c.Deliver(context.Background(), agent, "i", wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: text}, Session: "s"}, "")
		accs, errs = append(accs, acc), append(errs, err)
		if i == 0 && err == nil {
			waitRunning(t, c, agent, acc.SubmissionID)
		}
	}
	return accs, errs
}

func waitRunning(t *testing.T, c *client.Client, agent, id string) {
	t.Helper()
	check.For(t, time.Minute, 5*time.Millisecond, func() error {
		s, err := c.Submission(context.Background(), agent, "i", id, 0)
		if err != nil {
			t.Fatal(err)
		}
		if s.Status.Terminal() {
			t.Fatalf("never running: %+v", s)
		}
		if s.Status != record.StatusRunning {
			return fmt.Errorf("never running: %+v", s)
		}
		return nil
	})
}

// settled waits for every submission and returns the conversation's view.
func settled(t *testing.T, c *client.Client, agent string, accs ...wire.Accepted) projection.View {
	t.Helper()
	var recs []record.Record
	for _, a := range accs {
		if a.SubmissionID != "" {
			recs = servicetest.ReadUntilSettled(t, c, agent, "i", "s", record.Start, a.SubmissionID)
		}
	}
	return projection.Project(recs)
}

// replies maps a submission to the text of the assistant messages of its
// turn.
func replies(v projection.View) map[string]string {
	out := map[string]string{}
	for _, m := range v.Messages {
		if m.Role == "assistant" {
			for _, p := range m.Parts {
				out[m.SubmissionID] += p.Text
			}
		}
	}
	return out
}

func TestBusyPolicies(t *testing.T) {
	_, c := testService(t, withConfig(t, busyAgents))
	for _, agent := range []string{"joiner", "legacy"} {
		t.Run("join/"+agent, func(t *testing.T) {
			accs, errs := threeQuickPOSTs(t, c, agent)
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			v := settled(t, c, agent, accs...)
			s1, s2, s3 := settlement(v, accs[0].SubmissionID), settlement(v, accs[1].SubmissionID), settlement(v, accs[2].SubmissionID)
			if s1.Outcome != record.OutcomeCompleted || s1.AnsweredBySubmissionID != "" || s2.AnsweredBySubmissionID != "" || s3.AnsweredBySubmissionID != accs[1].SubmissionID || s3.Outcome != record.OutcomeCompleted {
				t.Fatalf("settlements %+v", v.Settlements)
			}
			r := replies(v)
			if r[accs[0].SubmissionID] != "first" || r[accs[1].SubmissionID] != "second\n\nthird" {
				t.Fatalf("replies %q", r)
			}
		})
	}
	t.Run("queue", func(t *testing.T) {
		accs, errs := threeQuickPOSTs(t, c, "queuer")
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		v := settled(t, c, "queuer", accs...)
		r := replies(v)
		for i, want := range []string{"first", "second", "third"} {
			s := settlement(v, accs[i].SubmissionID)
			if s.Outcome != record.OutcomeCompleted || s.AnsweredBySubmissionID != "" || r[accs[i].SubmissionID] != want {
				t.Fatalf("submission %d: %+v, reply %q", i, s, r[accs[i].SubmissionID])
			}
			if v.Settlements[i].SubmissionID != accs[i].SubmissionID {
				t.Fatalf("not settled in order: %+v", v.Settlements)
			}
		}
	})
	t.Run("reject", func(t *testing.T) {
		accs, errs := threeQuickPOSTs(t, c, "rejecter")
		if errs[0] != nil || !client.IsCode(errs[1], wire.CodeSessionBusy) || !client.IsCode(errs[2], wire.CodeSessionBusy) {
			t.Fatalf("%v", errs)
		}
		v := settled(t, c, "rejecter", accs[0])
		if len(v.Settlements) != 1 || settlement(v, accs[0].SubmissionID).Outcome != record.OutcomeCompleted || len(v.Messages) != 2 {
			t.Fatalf("%+v", v)
		}
	})
	t.Run("interrupt", func(t *testing.T) {
		accs, errs := threeQuickPOSTs(t, c, "interrupter")
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		v := settled(t, c, "interrupter", accs...)
		for i, want := range []record.Outcome{record.OutcomeAborted, record.OutcomeAborted, record.OutcomeCompleted} {
			if s := settlement(v, accs[i].SubmissionID); s.Outcome != want || s.AnsweredBySubmissionID != "" {
				t.Fatalf("submission %d: %+v (all %+v)", i, s, v.Settlements)
			}
		}
		if r := replies(v); r[accs[2].SubmissionID] != "third" {
			t.Fatalf("replies %q", r)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		acc := servicetest.Deliver(t, c, "slowpoke", "i", "s", "/sleep 30s\nlate")
		s := settlement(settled(t, c, "slowpoke", acc), acc.SubmissionID)
		if s.Outcome != record.OutcomeFailed || s.Error == nil || s.Error.Code != "deadline_exceeded" {
			t.Fatalf("%+v", s)
		}
	})
	t.Run("maxTurns", func(t *testing.T) {
		for i := range 2 {
			acc := servicetest.Deliver(t, c, "limited", "i", "s", "hello")
			if s, err := c.Submission(context.Background(), "limited", "i", acc.SubmissionID, 10*time.Second); err != nil || !s.Status.Terminal() {
				t.Fatalf("turn %d: %+v %v", i, s, err)
			}
		}
		_, err := c.Deliver(context.Background(), "limited", "i", wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: "one more"}, Session: "s"}, "")
		if !client.IsCode(err, wire.CodeTurnLimitReached) {
			t.Fatalf("third delivery: %v", err)
		}
		var apiErr *wire.APIError
		if e, ok := err.(*wire.APIError); ok {
			apiErr = e
		}
		if apiErr == nil || apiErr.Status != 409 {
			t.Fatalf("%#v", err)
		}
		// Another session has its own budget.
		servicetest.Deliver(t, c, "limited", "i", "other", "hello")
	})
}
