package datadir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHeldSaysWho(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(dir, true, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir, true, false)
	var he *HeldError
	if !errors.As(err, &he) || !errors.Is(err, ErrHeld) || he.PID != os.Getpid() {
		t.Fatalf("second open: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, err = Open(dir, true, false)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	f.Close()
}

func TestFolderStates(t *testing.T) {
	for _, tc := range []struct {
		name     string
		setup    func(t *testing.T, dir string)
		embedded bool
		refused  bool // without init
		new      bool // with init (or without, when not refused)
	}{
		{"absent", func(t *testing.T, dir string) { os.Remove(dir) }, true, false, true},
		{"empty folder", func(*testing.T, string) {}, true, false, true},
		{"empty jetstream folder only", func(t *testing.T, dir string) { mkdir(t, dir, JetStreamDir) }, true, false, true},
		{"0-byte log", func(t *testing.T, dir string) { write(t, dir, LogFile, nil) }, true, true, true},
		{"0-byte log, external broker", func(t *testing.T, dir string) { write(t, dir, LogFile, nil) }, false, true, true},
		{"jetstream store, no log", func(t *testing.T, dir string) {
			mkdir(t, dir, JetStreamDir)
			write(t, filepath.Join(dir, JetStreamDir), "x", []byte("x"))
		}, true, true, true},
		{"jetstream store, no log, external broker", func(t *testing.T, dir string) {
			mkdir(t, dir, JetStreamDir)
			write(t, filepath.Join(dir, JetStreamDir), "x", []byte("x"))
		}, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, init := range []bool{false, true} {
				dir := filepath.Join(t.TempDir(), "data")
				os.MkdirAll(dir, 0o755)
				tc.setup(t, dir)
				f, err := Open(dir, tc.embedded, init)
				if tc.refused && !init {
					if !errors.Is(err, ErrIncomplete) {
						t.Fatalf("want refusal, got %v", err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("init=%v: %v", init, err)
				}
				if f.New != tc.new {
					t.Fatalf("init=%v: New=%v", init, f.New)
				}
				if info, err := os.Stat(f.LogPath()); err != nil || info.Size() == 0 {
					t.Fatalf("no log made: %v", err)
				}
				f.Close()
			}
		})
	}
}

// A log with data and no store: refused after the log is open, unless
// init; a log never written (a first start cut short) is not.
func TestLogWithoutStore(t *testing.T) {
	dir := t.TempDir()
	db, err := clog.Open(filepath.Join(dir, LogFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	check := func(init bool) error {
		f, err := Open(dir, true, init)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		db, err := clog.Open(f.LogPath(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		return f.CheckLog(db)
	}
	if err := check(false); err != nil {
		t.Fatalf("never-written log refused: %v", err)
	}
	db, _ = clog.Open(filepath.Join(dir, LogFile), nil)
	if _, err := db.Append(t.Context(), record.Key{Agent: "a", Instance: "i", Session: "s"},
		record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: []byte(`{"parts":[]}`)})); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if err := check(false); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("log without store: %v", err)
	}
	if err := check(true); err != nil {
		t.Fatalf("with init: %v", err)
	}
	// A restore (convlog restore) puts a log in place with no store: the
	// next start takes it, once.
	if err := MarkRestored(dir); err != nil {
		t.Fatal(err)
	}
	if err := check(false); err != nil {
		t.Fatalf("restored log refused: %v", err)
	}
	if err := check(false); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("the restore mark outlived its start: %v", err)
	}
}

func mkdir(t *testing.T, dir, name string) {
	if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, dir, name string, b []byte) {
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}
