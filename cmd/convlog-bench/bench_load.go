package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The load generator of `convlog bench`: closed-loop clients (each sends
// its next request when the previous one is answered) and an open-loop
// schedule (requests leave at fixed times whatever the answers do, and each
// latency is counted from its scheduled time, so a stall is not hidden by
// the requests it delayed). Every sample is kept; percentiles are exact.

// benchLatency summarizes samples.
type benchLatency struct {
	n             int
	p50, p99, max time.Duration
	mean          time.Duration
}

// benchSummarize sorts s in place.
func benchSummarize(s []time.Duration) benchLatency {
	if len(s) == 0 {
		return benchLatency{}
	}
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return benchLatency{n: len(s), p50: benchPct(s, 50), p99: benchPct(s, 99), max: s[len(s)-1], mean: sum / time.Duration(len(s))}
}

// benchPct is the nearest-rank percentile of sorted s.
func benchPct(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

func fmtMS(d time.Duration) string {
	f := float64(d) / float64(time.Millisecond)
	switch {
	case f == 0:
		return "0"
	case f < 1:
		return fmt.Sprintf("%.3f ms", f)
	case f < 10:
		return fmt.Sprintf("%.2f ms", f)
	case f < 100:
		return fmt.Sprintf("%.1f ms", f)
	}
	return fmt.Sprintf("%.0f ms", f)
}

// benchResult is one run of a load shape.
type benchResult struct {
	lat      benchLatency
	samples  []time.Duration // sorted (closed loop)
	ok       int             // answered as wanted within the window
	errs     int             // failed or answered otherwise
	dropped  int             // open loop: not sent, too many in flight
	elapsed  time.Duration   // the measured window
	firstErr error
	note     string
}

func (r benchResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ok) / r.elapsed.Seconds()
}

// benchHTTPClient is a keep-alive client for up to conns concurrent requests
// to one host.
func benchHTTPClient(conns int) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns * 2,
		MaxIdleConnsPerHost: conns * 2,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

// benchClosedLoop runs workers that each repeat op until the window ends. The
// first warmup is not measured; the window lasts dur after it. op returns
// an error for a failure (counted, not fatal). At most maxOps operations
// run in the window (0: no bound but time).
func benchClosedLoop(ctx context.Context, workers int, warmup, dur time.Duration, maxOps int, op func(worker int) error) benchResult {
	start := time.Now()
	measureFrom := start.Add(warmup)
	stopAt := measureFrom.Add(dur)
	ctx, cancel := context.WithDeadline(ctx, stopAt.Add(30*time.Second))
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      []time.Duration
		errs     atomic.Int64
		ops      atomic.Int64
		firstErr error
		lastDone atomic.Int64
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(stopAt) {
					break
				}
				measured := !t0.Before(measureFrom)
				if measured && maxOps > 0 && ops.Add(1) > int64(maxOps) {
					break
				}
				err := op(w)
				t1 := time.Now()
				if !measured {
					continue
				}
				if err != nil {
					if errs.Add(1) == 1 {
						mu.Lock()
						firstErr = err
						mu.Unlock()
					}
					continue
				}
				local = append(local, t1.Sub(t0))
				for {
					old := lastDone.Load()
					if t1.UnixNano() <= old || lastDone.CompareAndSwap(old, t1.UnixNano()) {
						break
					}
				}
			}
			mu.Lock()
			all = append(all, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := dur
	if ld := time.Unix(0, lastDone.Load()); lastDone.Load() != 0 && ld.Before(stopAt) && maxOps > 0 {
		elapsed = ld.Sub(measureFrom) // the op bound ended it early
	}
	return benchResult{lat: benchSummarize(all), samples: all, ok: len(all), errs: int(errs.Load()), elapsed: elapsed, firstErr: firstErr}
}

// benchOpenLoop sends rate requests per second for dur, each in its own
// goroutine, at most maxInflight at once (over that, a request is dropped
// and counted). Latency is measured from each request's scheduled time.
func benchOpenLoop(ctx context.Context, rate int, dur time.Duration, maxInflight int, op func(i int) error) benchResult {
	n := int(float64(rate) * dur.Seconds())
	interval := time.Second / time.Duration(rate)
	ctx, cancel := context.WithTimeout(ctx, dur+60*time.Second)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      = make([]time.Duration, 0, n)
		inflight atomic.Int64
		errs     atomic.Int64
		firstErr error
		lastDone atomic.Int64
	)
	dropped := 0
	start := time.Now()
	for i := 0; i < n && ctx.Err() == nil; {
		now := time.Now()
		for ; i < n; i++ {
			due := start.Add(time.Duration(i) * interval)
			if due.After(now) {
				break
			}
			if inflight.Load() >= int64(maxInflight) {
				dropped++
				continue
			}
			inflight.Add(1)
			wg.Add(1)
			go func(i int, due time.Time) {
				defer wg.Done()
				defer inflight.Add(-1)
				err := op(i)
				t1 := time.Now()
				if err != nil {
					if errs.Add(1) == 1 {
						mu.Lock()
						firstErr = err
						mu.Unlock()
					}
					return
				}
				mu.Lock()
				all = append(all, t1.Sub(due))
				mu.Unlock()
				for {
					old := lastDone.Load()
					if t1.UnixNano() <= old || lastDone.CompareAndSwap(old, t1.UnixNano()) {
						break
					}
				}
			}(i, due)
		}
		if i < n {
			next := start.Add(time.Duration(i) * interval)
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
		}
	}
	wg.Wait()
	elapsed := dur
	if ld := lastDone.Load(); ld != 0 {
		elapsed = max(dur, time.Unix(0, ld).Sub(start))
	}
	return benchResult{lat: benchSummarize(all), ok: len(all), errs: int(errs.Load()), dropped: dropped, elapsed: elapsed, firstErr: firstErr}
}

// benchMessageBody is a delivery body of exactly size bytes (if size allows)
// for session: {"message":{"kind":"user","body":"word word …"},"session":"…"}.
func benchMessageBody(session string, size int) []byte {
	head := `{"message":{"kind":"user","body":"`
	tail := `"},"session":"` + session + `"}`
	fill := size - len(head) - len(tail)
	if fill < 4 {
		fill = 4
	}
	var b strings.Builder
	b.WriteString(head)
	for i := 0; i < fill; i++ {
		if i%8 == 7 && i != fill-1 {
			b.WriteByte(' ')
		} else {
			b.WriteByte("abcdefghijklmnopqrstuvwxyz"[i%26])
		}
	}
	b.WriteString(tail)
	return []byte(b.String())
}

// benchPost POSTs body as JSON and returns the status, reading the
// response to the end so the connection is reused.
func benchPost(ctx context.Context, c *http.Client, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// benchGet reads url to the end; it returns the status and the body.
func benchGet(ctx context.Context, c *http.Client, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// benchWantStatus turns an unexpected status into an error.
func benchWantStatus(got, want int, body []byte) error {
	if got == want {
		return nil
	}
	if len(body) > 200 {
		body = body[:200]
	}
	return fmt.Errorf("status %d, want %d: %s", got, want, body)
}
