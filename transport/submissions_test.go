package transport_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

func TestSubmissionWaitReturnsOnSettle(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	acc, err := e.c.Deliver(ctx, "echo", "i1", wire.DeliverRequest{Message: wire.Message{Body: "work"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		sub record.Submission
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		s, err := e.c.Submission(ctx, "echo", "i1", acc.SubmissionID, 30*time.Second)
		done <- result{s, err, time.Now()}
	}()
	// The test's own Watch counts one; the parked long poll, another.
	w := e.db.Watch(streamKey)
	defer w.Close()
	parked := func() error {
		select {
		case r := <-done:
			t.Fatalf("returned before the settlement: %+v", r)
		default:
		}
		if n := w.Waiters(); n < 2 {
			return fmt.Errorf("%d waiting on the stream, want the long poll too", n)
		}
		return nil
	}
	check.For(t, time.Minute, time.Millisecond, parked)
	// Appending something else wakes the waiter, which must keep waiting:
	// one that returned on the wake would answer the status from before
	// the settlement, which the checks below refuse.
	woken := w.Changed()
	if _, err := e.db.Append(ctx, streamKey, assistantText("thinking")); err != nil {
		t.Fatal(err)
	}
	<-woken
	check.For(t, time.Minute, time.Millisecond, parked)
	settled := time.Now()
	if _, err := e.db.Write(ctx, log.Write{Key: streamKey, Settle: []record.Settlement{{
		SubmissionID: acc.SubmissionID, Outcome: record.OutcomeFailed, Error: &record.Failure{Code: "model", Message: "overloaded", Retryable: true},
	}}}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.sub.Status != record.StatusFailed || r.sub.Error == nil || r.sub.Error.Message != "overloaded" || r.sub.ID != acc.SubmissionID || r.sub.SettledAt.IsZero() {
		t.Fatalf("settled submission %+v", r.sub)
	}
	if d := r.at.Sub(settled); d > 2*time.Second {
		t.Errorf("waiter returned %v after the settlement", d)
	}
	// Settled already: no waiting at all.
	start := time.Now()
	if s, err := e.c.Submission(ctx, "echo", "i1", acc.SubmissionID, time.Minute); err != nil || s.Status != record.StatusFailed || time.Since(start) > 2*time.Second {
		t.Fatalf("%+v %v after %v", s, err, time.Since(start))
	}
}

func TestSubmissionWaitTimesOut(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	acc, err := e.c.Deliver(ctx, "echo", "i1", wire.DeliverRequest{Message: wire.Message{Body: "slow"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s, err := e.c.Submission(ctx, "echo", "i1", acc.SubmissionID, 200*time.Millisecond)
	if err != nil || s.Status != record.StatusAdmitted {
		t.Fatalf("%+v %v", s, err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 3*time.Second {
		t.Errorf("wait of 200ms took %v", d)
	}
	// A client that gives up frees the handler.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := e.c.Submission(cctx, "echo", "i1", acc.SubmissionID, 30*time.Second); err == nil {
		t.Fatal("no error after the client's deadline")
	}
	e.waitIdle(t)
}

func TestSubmissionErrors(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	acc, err := e.c.Deliver(ctx, "echo", "i1", wire.DeliverRequest{Message: wire.Message{Body: "x"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path   string
		status int
		code   string
	}{
		{"/agents/echo/i1/submissions/sub_nope", 404, "not_found"},
		{"/agents/echo/i2/submissions/" + acc.SubmissionID, 404, "not_found"},  // another instance
		{"/agents/plain/i1/submissions/" + acc.SubmissionID, 404, "not_found"}, // another agent
		{"/agents/echo/i1/submissions/" + strings.Repeat("s", 300), 404, "not_found"},
		{"/agents/ghost/i1/submissions/" + acc.SubmissionID, 404, "not_found"},
		{"/agents/echo/i1/submissions/" + acc.SubmissionID + "?wait=soon", 400, "invalid_wait"},
		{"/agents/echo/i1/submissions/" + acc.SubmissionID + "?wait=61s", 400, "invalid_wait"},
		{"/agents/echo/i1/submissions/" + acc.SubmissionID + "?wait=-1s", 400, "invalid_wait"},
		{"/agents/echo/i1/submissions/" + acc.SubmissionID + "?wait=30", 400, "invalid_wait"},
	}
	for _, tc := range cases {
		status, _, b := e.do(t, "GET", tc.path, nil, nil)
		if status != tc.status || errorOf(t, b)["code"] != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.path, status, b, tc.status, tc.code)
		}
	}
	status, _, b := e.do(t, "GET", "/agents/echo/i1/submissions/"+acc.SubmissionID+"?wait=0s", nil, nil)
	if status != http.StatusOK || !strings.Contains(string(b), `"status":"admitted"`) {
		t.Errorf("wait=0s: %d %s", status, b)
	}
}
