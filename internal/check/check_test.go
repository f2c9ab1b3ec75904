package check_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
)

// recorder keeps what For reports instead of failing the test.
type recorder struct{ failed string }

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		okAfter  int // calls that fail before one succeeds; -1 never
		wantFail string
	}{
		{"true at once", 0, ""},
		{"true after some calls", 3, ""},
		{"never true reports the last error", -1, "not yet: call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &recorder{}
			calls := 0
			check.For(r, 200*time.Millisecond, time.Millisecond, func() error {
				calls++
				if tc.okAfter >= 0 && calls > tc.okAfter {
					return nil
				}
				return fmt.Errorf("not yet: call %d", calls)
			})
			if tc.wantFail == "" {
				if r.failed != "" || calls != tc.okAfter+1 {
					t.Fatalf("failed %q after %d calls, want success on call %d", r.failed, calls, tc.okAfter+1)
				}
				return
			}
			last := fmt.Sprintf("call %d", calls)
			if !strings.Contains(r.failed, tc.wantFail) || !strings.HasSuffix(r.failed, last) || calls < 2 {
				t.Fatalf("failed %q after %d calls, want the last error (%s)", r.failed, calls, last)
			}
		})
	}
}

// The bound is kept even when a call is slower than the interval.
func TestForStopsAtTheBound(t *testing.T) {
	t.Parallel()
	r := &recorder{}
	start := time.Now()
	check.For(r, 50*time.Millisecond, time.Hour, func() error { return errors.New("never") })
	if r.failed == "" {
		t.Fatal("no failure")
	}
	took := time.Since(start)
	if took > 10*time.Second {
		t.Fatalf("took %v with a 50ms bound", took)
	}
}
