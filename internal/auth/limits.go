package auth

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter enforces Limits per principal. Its memory is bounded: principals
// idle for a while are forgotten (their bucket would be full again anyway).
type Limiter struct {
	limits Limits

	mu   sync.Mutex
	seen map[string]*principalState
	last time.Time // of the last sweep
}

type principalState struct {
	deliveries *rate.Limiter
	streams    int
	used       time.Time
}

// idleForget is how long an idle principal's state is kept.
const idleForget = 10 * time.Minute

// NewLimiter returns a limiter for l.
func NewLimiter(l Limits) *Limiter {
	return &Limiter{limits: l, seen: map[string]*principalState{}}
}

func key(p Principal) string { return p.Issuer + "\x00" + p.Subject }

func (l *Limiter) state(p Principal, now time.Time) *principalState {
	if now.Sub(l.last) > idleForget {
		l.last = now
		for k, st := range l.seen {
			if st.streams == 0 && now.Sub(st.used) > idleForget {
				delete(l.seen, k)
			}
		}
	}
	st := l.seen[key(p)]
	if st == nil {
		st = &principalState{}
		if r := l.limits.DeliveriesPerSecond; r > 0 {
			burst := l.limits.Burst
			if burst <= 0 {
				burst = max(1, int(math.Ceil(r)))
			}
			st.deliveries = rate.NewLimiter(rate.Limit(r), burst)
		}
		l.seen[key(p)] = st
	}
	st.used = now
	return st
}

// AllowDelivery takes one delivery from p's bucket. When it is empty it
// returns false and how long until a delivery would be allowed.
func (l *Limiter) AllowDelivery(p Principal) (ok bool, retryAfter time.Duration) {
	if l == nil || l.limits.DeliveriesPerSecond <= 0 {
		return true, 0
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state(p, now)
	r := st.deliveries.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// OpenStream counts a stream of p, or refuses it over the cap. A granted
// stream is released with the returned function, which is safe to call
// twice.
func (l *Limiter) OpenStream(p Principal) (release func(), ok bool) {
	if l == nil || l.limits.Streams <= 0 {
		return func() {}, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state(p, time.Now())
	if st.streams >= l.limits.Streams {
		return nil, false
	}
	st.streams++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			st.streams--
			st.used = time.Now()
		})
	}, true
}
