package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
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
		// 10 words at 50ms finish well within 60s.
		{"finishes within the timeout", "60s", "a b c d e f g h i j", record.OutcomeCompleted, ""},
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
			var acc transport.Accepted
			deadline := time.Now().Add(30 * time.Second)
			for {
				var err error
				acc, err = c.Deliver(ctx, "echo", "i", transport.DeliverRequest{Message: transport.Message{Kind: "user", Body: tc.body}, Session: "s"}, "")
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("service never answered: %v\n%s", err, out.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			// SIGTERM must find the turn running, or the test says nothing
			// about how a stop settles a running turn.
			for deadline = time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				sub, err := c.Submission(ctx, "echo", "i", acc.SubmissionID, 0)
				if err != nil {
					t.Fatal(err)
				}
				if sub.Status == clog.StatusRunning {
					break
				}
				if sub.Status.Terminal() || time.Now().After(deadline) {
					t.Fatalf("submission never seen running: %s", sub.Status)
				}
			}
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
