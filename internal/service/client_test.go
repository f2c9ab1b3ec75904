package service

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/servicetest"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
)

// TestConversationSurvivesRestart follows a conversation with the Go
// client's projected-state iterator while the service stops mid-answer
// and starts again on the same address and data: the iterator says it is
// reconnecting, then shows the settlement, and the user message appears
// once.
func TestConversationSurvivesRestart(t *testing.T) {
	cfg := withDefaults(t, func(c *Config) { c.EchoDelay = 50 * time.Millisecond; c.ShutdownTimeout = 50 * time.Millisecond })
	svc, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = svc.Addr()
	running := svc
	defer func() { _ = running.Stop(context.Background()) }()
	c := &client.Client{BaseURL: "http://" + svc.Addr()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	acc := servicetest.Deliver(t, c, "echo", "restart", "", strings.Repeat("word ", 100))

	var stopped, reconnecting bool
	var second string
	for st, err := range c.Conversation(ctx, "echo", "restart", client.FollowOptions{Live: client.LiveSSE, Deltas: true, RetryMax: 200 * time.Millisecond}) {
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !stopped && len(st.Preview) > 0:
			// Mid-answer: stop the service, which settles the turn
			// interrupted, and start it again.
			if err := running.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			stopped = true
			if running, err = Start(cfg); err != nil {
				t.Fatal(err)
			}
		case st.Reconnecting:
			reconnecting = true
		}
		switch len(st.Settlements) {
		case 0:
			continue
		case 1:
			s := st.Settlements[0]
			if s.SubmissionID != acc.SubmissionID || s.Outcome != record.OutcomeFailed || s.Error == nil || s.Error.Code != "interrupted" {
				t.Fatalf("after the restart: settlements %+v", st.Settlements)
			}
			if second == "" {
				// The old stream ended with the old service: what comes
				// next needs a reconnection.
				second = servicetest.Deliver(t, c, "echo", "restart", "", "after").SubmissionID
			}
			continue
		}
		ids := map[string]bool{}
		users := 0
		for _, m := range st.Messages {
			if ids[m.ID] {
				t.Fatalf("message %s twice: %+v", m.ID, st.Messages)
			}
			ids[m.ID] = true
			if m.Role == "user" {
				users++
			}
		}
		if s := st.Settlements[1]; users != 2 || s.SubmissionID != second || s.Outcome != record.OutcomeCompleted {
			t.Fatalf("%d user messages, settlements %+v", users, st.Settlements)
		}
		break
	}
	if !stopped || !reconnecting {
		t.Fatalf("stopped %v, reconnecting seen %v", stopped, reconnecting)
	}
}
