// Package check is the one polling helper of the tests: wait for a
// condition that another goroutine or process makes true, with a generous
// bound, and say what was last wrong when the bound passes. It is a leaf:
// it imports nothing of the product, so any test package can use it.
//
// The bound is a safety net for a hung test, not a speed check: tests run
// on loaded 2-core machines, so pick it many times what the condition
// usually takes.
package check

import "time"

// T is the part of testing.TB that For uses. *testing.T, *testing.B and
// testing.TB have it, and so do the property tests' *rapid.T and the
// helpers that pass either along.
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// For calls fn at once and then every `every` until it returns nil, and
// fails t with fn's last error if that has not happened within total. fn
// runs on the caller's goroutine, so it may call t.Fatal itself for a
// state that waiting cannot fix (a submission that settled when it
// should have been running, a child that exited).
func For(t T, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("not within %v: %v", total, err)
			return
		}
		time.Sleep(min(every, max(time.Until(deadline), 0)))
	}
}
