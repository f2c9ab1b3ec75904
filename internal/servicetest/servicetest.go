// Package servicetest holds the helpers that the tests of the service, in
// process (internal/service) and as a child process (cmd/convlog), share:
// delivering a message, reading until its settlement, a tmpfs volume, a
// buffer safe to write from a child's output goroutine. Only tests import
// it.
package servicetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

// Deliver posts a user message to session and returns its 202.
func Deliver(t testing.TB, c *client.Client, agent, instance, session, text string) wire.Accepted {
	t.Helper()
	acc, err := c.Deliver(context.Background(), agent, instance,
		wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: text}, Session: session}, "")
	if err != nil {
		t.Fatalf("deliver: %v", err)
	}
	return acc
}

// ReadUntilSettled reads the conversation from offset until the
// submission's settlement record, long-polling the submission between
// reads, and returns every record read.
func ReadUntilSettled(t testing.TB, c *client.Client, agent, instance, session string, offset record.Offset, subID string) []record.Record {
	t.Helper()
	var out []record.Record
	// No sleep between calls: the long poll below does the waiting.
	check.For(t, time.Minute, 0, func() error {
		res, err := c.Read(context.Background(), agent, instance, session, offset, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range res.Batches {
			recs, err := b.Records.Decode()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, recs...)
		}
		offset = res.NextOffset
		for _, r := range out {
			if r.Kind == record.KindEntry && r.Entry.Type == record.EntrySettlement && r.Entry.SubmissionID == subID {
				return nil
			}
		}
		if res.UpToDate {
			// Long-poll the submission instead of spinning.
			if _, err := c.Submission(context.Background(), agent, instance, subID, 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		return fmt.Errorf("no settlement for %s; read %d records", subID, len(out))
	})
	return out
}

// MountTmpfs mounts a tmpfs of size ("64m") for the test, unmounted at
// its end. Without the right to mount the test skips, or fails under CI.
func MountTmpfs(t *testing.T, size string) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt).CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and a tmpfs cannot be mounted (run as root): %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs here (needs root; set CI to make this a failure): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

// FillDisk writes path until its volume is full (ENOSPC), in smaller and
// smaller writes so that not even 512 bytes are left.
func FillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for _, n := range []int{1 << 20, 64 << 10, 4 << 10, 512} {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes and reads: a
// child process's stderr, a logger's output.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
