package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

// The real binary on SIGTERM exits 0, and only after the running turn is
// settled: a turn that fits in --shutdown-timeout completes, one that does
// not is settled failed/interrupted. The settlement is read back from the
// stream by a second process on the same folder, so it is what was made
// durable before the exit, not what the first process said.
func TestSIGTERMExitsZero(t *testing.T) {
	bin := buildCLI(t)
	for _, tc := range []struct {
		name            string
		shutdownTimeout string
		body            string
		outcome         record.Outcome
		code            string
	}{
		// 40 words at 50ms: 2s, long enough to be seen running on a
		// loaded machine, and well within 60s.
		{"finishes within the timeout", "60s", strings.Repeat("w ", 40), record.OutcomeCompleted, ""},
		// 400 words at 50ms take 20s, far past 100ms.
		{"cut at the timeout", "100ms", strings.Repeat("w ", 400), record.OutcomeFailed, "interrupted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, data := freeAddr(t), t.TempDir()
			cmd := exec.Command(bin, "serve", "--listen", addr, "--data", data, "--shutdown-timeout", tc.shutdownTimeout, "--echo-delay", "50ms")
			var out strings.Builder
			cmd.Stderr = &lockedWriter{w: &out}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-done
			})
			c := &client.Client{BaseURL: "http://" + addr}
			ctx := context.Background()
			var acc wire.Accepted
			check.For(t, time.Minute, 20*time.Millisecond, func() error {
				var err error
				acc, err = c.Deliver(ctx, "echo", "i", wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: tc.body}, Session: "s"}, "")
				if err != nil {
					return fmt.Errorf("service never answered: %w\n%s", err, out.String())
				}
				return nil
			})
			// SIGTERM must find the turn running, or the test says nothing
			// about how a stop settles a running turn.
			check.For(t, time.Minute, 10*time.Millisecond, func() error {
				sub, err := c.Submission(ctx, "echo", "i", acc.SubmissionID, 0)
				if err != nil {
					t.Fatal(err)
				}
				if sub.Status.Terminal() {
					t.Fatalf("submission settled %s before SIGTERM", sub.Status)
				}
				if sub.Status != record.StatusRunning {
					return fmt.Errorf("submission is %s, not running", sub.Status)
				}
				return nil
			})
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				done <- err
				if err != nil {
					t.Fatalf("exit: %v\n%s", err, out.String())
				}
			case <-time.After(90 * time.Second):
				t.Fatalf("no exit 90s after SIGTERM\n%s", out.String())
			}
			if !strings.Contains(out.String(), "convlog stopped") {
				t.Fatalf("no clean stop in the log:\n%s", out.String())
			}

			serveCLIProcess(t, bin, addr, data)
			var got []record.Settlement
			for offset := record.Offset(""); ; {
				page, err := c.Read(ctx, "echo", "i", "s", offset, 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, b := range page.Batches {
					recs, err := b.Records.Decode()
					if err != nil {
						t.Fatal(err)
					}
					for _, r := range recs {
						if r.Entry == nil || r.Entry.Type != record.EntrySettlement || r.Entry.SubmissionID != acc.SubmissionID {
							continue
						}
						var st record.Settlement
						if err := json.Unmarshal(r.Entry.Payload, &st); err != nil {
							t.Fatal(err)
						}
						got = append(got, st)
					}
				}
				if page.UpToDate {
					break
				}
				offset = page.NextOffset
			}
			if len(got) != 1 {
				t.Fatalf("%d settlement records of %s, want 1: %+v", len(got), acc.SubmissionID, got)
			}
			st := got[0]
			code := ""
			if st.Error != nil {
				code = st.Error.Code
			}
			if st.SubmissionID != acc.SubmissionID || st.Outcome != tc.outcome || code != tc.code {
				t.Fatalf("settlement %+v (code %q), want %s %q", st, code, tc.outcome, tc.code)
			}
		})
	}
}
