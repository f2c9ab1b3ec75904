package log_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// damagedFixture writes a log of a few hundred batches across many
// sessions, big enough for bbolt to spread it over many pages, closes it
// and returns its path.
func damagedFixture(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "convlog.db")
	db, err := clog.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 60 {
		k := record.Key{Agent: "echo", Instance: "i", Session: fmt.Sprint("s", i%30)}
		var recs []record.Record
		for j := range 5 {
			recs = append(recs, userEntry(strings.Repeat(fmt.Sprint("record ", i, " ", j, " "), 40)))
		}
		if _, err := db.Append(ctx, k, recs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// readAll reads every stream of the fixture back.
func readAll(ctx context.Context, db *clog.DB) error {
	for i := range 30 {
		k := record.Key{Agent: "echo", Instance: "i", Session: fmt.Sprint("s", i)}
		off := record.Start
		for {
			res, err := db.Read(ctx, k, off, 0)
			if err != nil {
				return err
			}
			for _, b := range res.Batches {
				if _, err := b.Records.Decode(); err != nil {
					return err
				}
			}
			if res.UpToDate {
				break
			}
			off = res.NextOffset
		}
	}
	return nil
}

func wantCorrupt(t *testing.T, path string, err error) {
	t.Helper()
	var ce *clog.CorruptError
	if !errors.Is(err, clog.ErrCorrupt) || !errors.As(err, &ce) {
		t.Fatalf("open of a damaged file: %v, want a CorruptError", err)
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "backup") {
		t.Fatalf("message does not name the file and the remedy: %s", msg)
	}
}

// A truncated file used to be mapped as it was and die with SIGBUS at the
// first read past its end.
func TestOpenTruncated(t *testing.T) {
	path := damagedFixture(t)
	// bbolt grows the file ahead of its pages: cut into the pages.
	for _, size := range []int64{16 * 4096, 3 * 4096, 100} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "convlog.db")
			copyFile(t, path, p)
			if err := os.Truncate(p, size); err != nil {
				t.Fatal(err)
			}
			db, err := clog.Open(p, nil)
			if err == nil {
				db.Close()
			}
			wantCorrupt(t, p, err)
		})
	}
}

// Random bytes over the data pages used to panic inside bbolt ("assertion
// failed: Page expected to be ..."), in a goroutine no caller can recover.
// Every seed must either open (the damage hit free pages) and read back,
// or be refused as damaged: never crash.
func TestOpenRandomBytes(t *testing.T) {
	path := damagedFixture(t)
	rep, err := clog.Check(path, clog.CheckShape, 0)
	if err != nil {
		t.Fatal(err)
	}
	used := rep.Pages * int64(rep.PageSize)
	refused := 0
	for seed := range uint64(40) {
		p := filepath.Join(t.TempDir(), "convlog.db")
		copyFile(t, path, p)
		rng := rand.New(rand.NewPCG(seed, 7))
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Past the two meta pages, a few runs of garbage.
		for range 1 + seed%4 {
			off := 2*4096 + rng.Int64N(used-3*4096)
			buf := make([]byte, 16+rng.IntN(4096))
			for i := range buf {
				buf[i] = byte(rng.Uint32())
			}
			if _, err := f.WriteAt(buf, off); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		db, err := clog.Open(p, nil)
		if err != nil {
			wantCorrupt(t, p, err)
			refused++
			continue
		}
		// Damage the walk cannot see (garbage inside a value) must still
		// give errors, not a crash.
		_ = readAll(context.Background(), db)
		db.Close()
	}
	if refused == 0 {
		t.Fatal("no damaged file was refused")
	}
	t.Logf("%d of 40 damaged files refused at open", refused)
}

func TestOpenBadMetaPages(t *testing.T) {
	path := damagedFixture(t)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 4096)
	f.WriteAt(zero, 0)
	f.WriteAt(zero, 4096)
	f.Close()
	_, err = clog.Open(path, nil)
	wantCorrupt(t, path, err)
	if !strings.Contains(err.Error(), "meta") {
		t.Fatalf("message does not say what is wrong: %v", err)
	}
}

// A file damaged under a running log: reads fail with ErrCorrupt, the
// process lives on, and Health says the file is damaged.
func TestDamagedAtRunTime(t *testing.T) {
	for _, how := range []string{"truncated", "overwritten"} {
		t.Run(how, func(t *testing.T) {
			path := damagedFixture(t)
			db, err := clog.Open(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.Health(); err != nil {
				t.Fatalf("health before: %v", err)
			}
			info, _ := os.Stat(path)
			switch how {
			case "truncated": // reads past the end fault (SIGBUS)
				if err := os.Truncate(path, 3*4096); err != nil {
					t.Fatal(err)
				}
			case "overwritten": // pages bbolt asserts on
				f, _ := os.OpenFile(path, os.O_RDWR, 0)
				junk := make([]byte, info.Size()-2*4096)
				for i := range junk {
					junk[i] = 0xA5
				}
				f.WriteAt(junk, 2*4096)
				f.Close()
			}
			err = readAll(context.Background(), db)
			if !errors.Is(err, clog.ErrCorrupt) {
				t.Fatalf("read of a damaged file: %v", err)
			}
			if err := db.Health(); !errors.Is(err, clog.ErrCorrupt) {
				t.Fatalf("health after: %v", err)
			}
		})
	}
}

func TestCheckModes(t *testing.T) {
	path := damagedFixture(t)
	for _, m := range []clog.CheckMode{clog.CheckShape, clog.CheckWalk, clog.CheckFull} {
		rep, err := clog.Check(path, m, 0)
		if err != nil {
			t.Fatalf("mode %d: %v", m, err)
		}
		if m != clog.CheckShape && rep.Keys == 0 {
			t.Fatalf("mode %d read nothing", m)
		}
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
