package log_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// MaxTurns is checked in the admitting transaction: of many racing
// deliveries exactly the limit gets in; a reset gives the session its
// turns back; a regenerate is a turn; and a count kept across admissions
// agrees with a fresh count of an older stream (one admitted without a
// limit).
func TestMaxTurnsInTheAdmittingTransaction(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t, nil)
	key := record.Key{Agent: "a", Instance: "i", Session: "s"}
	admit := func(max int) error {
		_, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userEntry("q")}, MaxTurns: max})
		return err
	}
	// Two admitted without a limit: the first limited admission counts them.
	for range 2 {
		if err := admit(0); err != nil {
			t.Fatal(err)
		}
	}
	const max = 5
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() { errs <- admit(max) })
	}
	wg.Wait()
	close(errs)
	in, refused := 0, 0
	for err := range errs {
		switch {
		case err == nil:
			in++
		case errors.Is(err, clog.ErrTurnLimit):
			refused++
		default:
			t.Fatal(err)
		}
	}
	if in != max-2 || refused != 20-(max-2) {
		t.Fatalf("%d admitted, %d refused; want %d and %d", in, refused, max-2, 20-(max-2))
	}
	// A regenerate is a turn too.
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeRegenerate, Key: key, MaxTurns: max}); !errors.Is(err, clog.ErrTurnLimit) {
		t.Fatalf("regenerate at the limit: %v", err)
	}
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeRegenerate, Key: key, MaxTurns: max + 1}); err != nil {
		t.Fatalf("regenerate under the limit: %v", err)
	}
	if err := admit(max + 1); !errors.Is(err, clog.ErrTurnLimit) {
		t.Fatalf("after the regenerate took the last turn: %v", err)
	}
	// A reset removes the turns.
	if _, _, err := db.Change(ctx, clog.Change{Kind: clog.ChangeReset, Key: key}); err != nil {
		t.Fatal(err)
	}
	for i := range max {
		if err := admit(max); err != nil {
			t.Fatalf("admission %d after the reset: %v", i, err)
		}
	}
	if err := admit(max); !errors.Is(err, clog.ErrTurnLimit) {
		t.Fatalf("after the reset's %d turns: %v", max, err)
	}
}
