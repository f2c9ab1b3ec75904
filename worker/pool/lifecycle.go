package pool

import (
	"context"
	"slices"

	"github.com/convlog/convlog/log/record"
)

// Quiesce runs fn, a lifecycle change of the sessions keys (a rewind, a
// delete), while no turn of theirs runs in this pool: it holds their
// stripes, so that no turn starts, and with abortFirst it first cancels
// the running ones and waits for them to settle (aborted, in their
// stream, before fn's change). Without abortFirst (a reset, which settles
// running submissions in the new incarnation itself) it cancels them after
// fn: their writes would fail on the incarnation anyway, this only stops
// the work sooner.
//
// Turns running in another process are not reached: their writes still
// land after the change. One process per data folder, as today, has none.
func (p *Pool) Quiesce(ctx context.Context, keys []record.Key, abortFirst bool, fn func(context.Context) error) error {
	// Stripes in index order, each once: two Quiesce calls never deadlock.
	idx := make([]int, 0, len(keys))
	for _, k := range keys {
		i := p.stripeIndex(k)
		if !slices.Contains(idx, i) {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	for _, i := range idx {
		p.stripes[i].Lock()
	}
	defer func() {
		for _, i := range slices.Backward(idx) {
			p.stripes[i].Unlock()
		}
	}()
	running := p.runningOf(keys)
	if abortFirst {
		for _, ts := range running {
			ts.cancel(errAborted)
		}
		// A turn's end takes no stripe: waiting under them is safe.
		for _, ts := range running {
			select {
			case <-ts.done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	err := fn(ctx)
	if !abortFirst {
		for _, ts := range running {
			ts.cancel(errAborted)
		}
	}
	return err
}

// runningOf is the turns running here for keys.
func (p *Pool) runningOf(keys []record.Key) []*turnState {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*turnState
	for _, ts := range p.running {
		if slices.Contains(keys, ts.key) && !slices.Contains(out, ts) {
			out = append(out, ts)
		}
	}
	return out
}

func (p *Pool) stripeIndex(key record.Key) int {
	for i := range p.stripes {
		if &p.stripes[i] == p.stripe(key) {
			return i
		}
	}
	return 0
}
