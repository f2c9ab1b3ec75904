package worker

import (
	"context"
	"iter"
	"strings"
	"time"
)

// Echo is the built-in agent: it streams the prompt back word by word, one
// text delta every Delay, then completes. It lets the service be tried, and
// measured, without a model.
type Echo struct {
	Delay time.Duration
}

// Invoke implements Agent.
func (e Echo) Invoke(ctx context.Context, _ Scope, prompt Prompt) iter.Seq[Event] {
	return func(yield func(Event) bool) {
		var timer *time.Timer
		if e.Delay > 0 {
			timer = time.NewTimer(e.Delay)
			defer timer.Stop()
		}
		for i, w := range words(prompt.Text) {
			if i > 0 && timer != nil {
				timer.Reset(e.Delay)
				select {
				case <-ctx.Done():
					return
				case <-timer.C:
				}
			}
			if ctx.Err() != nil || !yield(Text(w)) {
				return
			}
		}
		yield(Completed(nil))
	}
}

// words splits s into words that keep their trailing white space, so that
// the deltas concatenate back to s exactly.
func words(s string) []string {
	var out []string
	for len(s) > 0 {
		i := strings.IndexAny(s, " \t\n")
		if i < 0 {
			out = append(out, s)
			break
		}
		j := i
		for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n') {
			j++
		}
		out = append(out, s[:j])
		s = s[j:]
	}
	return out
}
