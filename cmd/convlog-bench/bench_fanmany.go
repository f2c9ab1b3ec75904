package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Fan-out across conversations: many conversations, a few readers each, all
// of them active. Where the one-conversation rows measure one commit
// reaching many sockets, this measures many commits each reaching a few:
// the shape of a deployment with many users, each with a tab or two open.

func (e *benchEnv) fanManyWorkload() string {
	return fmt.Sprintf("%s conversations × %d SSE readers each, all active: %d rounds of one POST per conversation, a round every %s; append → each reader",
		fmtCount(float64(e.sz.fanManySessions)), e.sz.fanManyReaders, e.sz.fanManyRounds, e.sz.fanManyEvery)
}

func (e *benchEnv) fanoutMany(ctx context.Context) error {
	return e.withService(ctx, "fanout-many", nil, func(c *benchChild) error {
		sessions := make([]string, e.sz.fanManySessions)
		for i := range sessions {
			sessions[i] = fmt.Sprintf("m-%d", i)
		}
		client := benchHTTPClient(64)
		defer client.CloseIdleConnections()
		mw, err := e.watchMemory(ctx, c, "")
		if err != nil {
			return err
		}
		write := func(ctx context.Context) error {
			return e.fanManyWrites(ctx, client, benchDeliverURL(c.addr), sessions)
		}
		tail := func(ctx context.Context, session string) (string, error) {
			return benchConvlogTail(ctx, client, c.addr, session)
		}
		res, elapsed, err := e.runFanoutMany(ctx, c.addr, sessions, e.sz.fanManyReaders, write, tail, func(phase string) { mw.measure(ctx, phase) })
		if err != nil {
			return err
		}
		n := len(sessions) * e.sz.fanManyReaders
		kib, desc := mw.perReader(n - res.connectErrs)
		e.rep.set("fanmany.convlog.kib", kib)
		rate := float64(res.frames) / elapsed.Seconds()
		key := "fanmany.convlog"
		e.rep.set(key+".fps", rate)
		extra := fmt.Sprintf("**%s durable frames/s** delivered (%s frames and %s deltas in %s, from the first POST to the last frame's arrival); %s; connect %s",
			fmtCount(rate), fmtCount(float64(res.frames)), fmtCount(float64(res.deltas)), elapsed.Round(time.Millisecond), desc, res.connectTime.Round(time.Millisecond))
		if res.connectErrs > 0 {
			extra += fmt.Sprintf("; %d readers failed to connect (%s)", res.connectErrs, benchOneLine(fmt.Sprint(res.firstErr)))
		}
		if res.behind > 0 {
			extra += fmt.Sprintf("; **%d readers had not reached the tail 60 s after the last write**", res.behind)
		}
		e.rep.add(benchRow{section: secBenchFanout, workload: e.fanManyWorkload(), system: "convlog",
			lat: e.rep.latVals(key, res.lat), other: extra})
		e.logf("fan-out many: %d frames p50 %s p99 %s, %.0f frames/s, behind %d", res.frames, fmtMS(res.lat.p50), fmtMS(res.lat.p99), rate, res.behind)
		return nil
	})
}

// fanManyWrites posts one message to every session per round, the round's
// POSTs spread evenly over its interval by a few concurrent clients.
func (e *benchEnv) fanManyWrites(ctx context.Context, client *http.Client, url string, sessions []string) error {
	const workers = 32
	for round := range e.sz.fanManyRounds {
		began := time.Now()
		per := e.sz.fanManyEvery / time.Duration(len(sessions))
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= len(sessions) {
						return
					}
					if d := time.Until(began.Add(time.Duration(i) * per)); d > 0 {
						time.Sleep(d)
					}
					body := []byte(fmt.Sprintf(`{"message":{"kind":"user","body":"fan out message %d"},"session":%q}`, round, sessions[i]))
					st, b, err := benchPost(ctx, client, url, body)
					if err == nil {
						err = benchWantStatus(st, http.StatusAccepted, b)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		if d := time.Until(began.Add(e.sz.fanManyEvery)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// runFanoutMany is runFanout over many sessions: perSession readers of each,
// from offset 0. It returns the latencies and the time from the first write
// to the last reader reaching its session's tail.
func (e *benchEnv) runFanoutMany(ctx context.Context, addr string, sessions []string, perSession int, write func(ctx context.Context) error, tail func(ctx context.Context, session string) (string, error), measure func(phase string)) (benchFanout, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var res benchFanout
	n := len(sessions) * perSession
	readers := make([]*benchSSE, n)
	var (
		connected sync.WaitGroup
		mu        sync.Mutex
		all       = make([]time.Duration, 0, n*e.sz.fanManyRounds*2)
		deltas    atomic.Int64
		frames    atomic.Int64
		connErrs  atomic.Int64
		firstErr  error
		lastIDs   = make([]atomic.Value, n)
		lastAt    atomic.Int64 // unix nanos of the latest durable frame
		readersWG sync.WaitGroup
	)
	start := time.Now()
	sem := make(chan struct{}, 128)
	for i := range n {
		connected.Add(1)
		readersWG.Add(1)
		sem <- struct{}{}
		session := sessions[i%len(sessions)]
		go func() {
			defer readersWG.Done()
			sc, err := openBenchSSE(ctx, addr, benchStreamPath(session, "0"), 4096)
			var ev benchSSEEvent
			if err == nil {
				err = sc.next(&ev) // ": connected"
			}
			<-sem
			if err == nil {
				readers[i] = sc
			}
			connected.Done()
			if err != nil {
				if connErrs.Add(1) == 1 {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
				if sc != nil {
					sc.Close()
				}
				return
			}
			local := make([]time.Duration, 0, e.sz.fanManyRounds*2)
			for {
				if err := sc.next(&ev); err != nil {
					break
				}
				now := time.Now()
				if ev.comment {
					continue
				}
				if bytes.HasPrefix(ev.data, benchDeltaPrefix) {
					deltas.Add(1)
					continue
				}
				if ts, ok := benchFirstTimestamp(ev.data); ok {
					local = append(local, now.Sub(ts))
					frames.Add(1)
					for at := now.UnixNano(); ; {
						prev := lastAt.Load()
						if prev >= at || lastAt.CompareAndSwap(prev, at) {
							break
						}
					}
				}
				if len(ev.id) > 0 {
					lastIDs[i].Store(string(ev.id))
				}
			}
			mu.Lock()
			all = append(all, local...)
			mu.Unlock()
		}()
	}
	connected.Wait()
	res.connectTime = time.Since(start)
	res.connectErrs = int(connErrs.Load())
	e.logf("fan-out many, %d readers: connected in %s (%d failed)", n, res.connectTime.Round(time.Millisecond), res.connectErrs)
	closeAll := func() {
		for _, sc := range readers {
			if sc != nil {
				sc.Close()
			}
		}
		readersWG.Wait()
	}
	if res.connectErrs == n {
		closeAll()
		return res, 0, fmt.Errorf("no reader connected: %v", firstErr)
	}
	if measure != nil {
		time.Sleep(time.Second)
		measure("connected")
	}
	began := time.Now()
	if err := write(ctx); err != nil {
		closeAll()
		return res, 0, err
	}
	want := make(map[string]string, len(sessions))
	for _, s := range sessions {
		t, err := tail(ctx, s)
		if err != nil {
			closeAll()
			return res, 0, errors.Join(fmt.Errorf("session %s", s), err)
		}
		want[s] = t
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		behind := 0
		for i := range lastIDs {
			if readers[i] == nil {
				continue
			}
			if v, _ := lastIDs[i].Load().(string); v != want[sessions[i%len(sessions)]] {
				behind++
			}
		}
		res.behind = behind
		if behind == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if measure != nil {
		measure("delivered")
	}
	closeAll()
	elapsed := time.Unix(0, lastAt.Load()).Sub(began)
	res.lat = benchSummarize(all)
	res.deltas, res.frames = deltas.Load(), frames.Load()
	res.firstErr = firstErr
	return res, elapsed, nil
}
