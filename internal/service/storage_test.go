package service

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/internal/servicetest"
)

// A full disk that failed a write of the embedded JetStream store leaves
// that store failing every later write, even once there is space again
// (nats-server keeps the error). The service restarts JetStream after the
// relay has failed for 15s, and is ready again by itself.
func TestEmbeddedStoreRevivesAfterFullDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out 15 s of a failing broker; skipped with -short")
	}
	mnt := servicetest.MountTmpfs(t, "160m")
	logs := &servicetest.SyncBuffer{}
	svc, c := testService(t, func(cfg *Config) {
		cfg.Data = filepath.Join(mnt, "data")
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	acc := servicetest.Deliver(t, c, "echo", "i", "s", "before")
	if s, err := c.Submission(context.Background(), "echo", "i", acc.SubmissionID, 20*time.Second); err != nil || s.Status != "completed" {
		t.Fatalf("before: %+v %v", s, err)
	}
	waitReady(t, svc.Addr(), http.StatusOK)

	servicetest.FillDisk(t, filepath.Join(mnt, "filler"))
	// Doorbells of a session with nothing admitted (the pool finds
	// nothing to run) until the store fails a write.
	js, err := jetstream.New(svc.nc)
	if err != nil {
		t.Fatal(err)
	}
	failed := false
	for range 20000 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.Publish(ctx, "convlog.submissions.echo",
			[]byte(`{"submissionId":"sub_none","agent":"echo","instance":"i","session":"empty"}`))
		cancel()
		if err != nil {
			failed = true
			break
		}
	}
	if !failed {
		t.Fatal("the store never failed a write on a full disk")
	}
	os.Remove(filepath.Join(mnt, "filler"))

	acc = servicetest.Deliver(t, c, "echo", "i", "s", "after")
	waitReady(t, svc.Addr(), http.StatusServiceUnavailable) // the relay fails
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	// JetStream is restarted after the relay has failed for 15 s, and a
	// publish takes up to 10 s to fail: a bound of its own, past
	// waitReady's 30 s, so that a loaded machine does not fail the test.
	check.For(t, 2*time.Minute, 100*time.Millisecond, func() error {
		if st := readyStatus(t, svc.Addr()); st != http.StatusOK {
			return fmt.Errorf("/readyz never ready again: %d", st)
		}
		return nil
	})
	if !strings.Contains(logs.String(), "embedded JetStream restarted") {
		t.Fatalf("ready without a restart:\n%s", logs.String())
	}
	if s, err := c.Submission(context.Background(), "echo", "i", acc.SubmissionID, 30*time.Second); err != nil || s.Status != "completed" {
		t.Fatalf("after: %+v %v\n%s", s, err, logs.String())
	}
}
