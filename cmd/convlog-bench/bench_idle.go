package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Idle readers: the many tabs a real deployment keeps open on
// conversations where nothing happens, with one busy conversation among
// them. It measures what an idle reader costs (memory) and whether it
// slows the busy one's delivery. The issue asks for 100,000; this machine's
// hard descriptor limit decides how many fit, and the row says so.

const (
	idleTarget    = 100_000 // the row the issue asks for
	idlePerConv   = 10
	idleHotReader = 100 // readers of the busy conversation
)

// idleReaders is how many idle readers fit beside the hot ones in both
// processes: the service caps its streams at the descriptor limit less a
// reserve (internal/fdlimit), and the generator holds one socket per
// reader too.
func (e *benchEnv) idleReaders() int {
	limit := e.nofile
	reserve := min(max(limit/8, 256), 8192) // fdlimit.Reserve, which the child uses
	n := int(limit) - int(reserve) - idleHotReader
	if e.opts.quick {
		n = min(n, 200)
	}
	n = min(n, idleTarget)
	return max(n/idlePerConv*idlePerConv, 0)
}

func (e *benchEnv) idleWorkload(n int) string {
	return fmt.Sprintf("%s idle SSE readers over %s conversations (%d each), and %d readers of one more where %d POSTs come every %s; append → each of its readers",
		fmtCount(float64(n)), fmtCount(float64(n/idlePerConv)), idlePerConv, idleHotReader, e.sz.fanoutWrites, e.sz.fanoutEvery)
}

func (e *benchEnv) fanoutIdle(ctx context.Context) error {
	n := e.idleReaders()
	if n == 0 {
		return fmt.Errorf("no descriptors for idle readers (limit %d)", e.nofile)
	}
	return e.withService(ctx, "fanout-idle", nil, func(c *benchChild) error {
		client := benchHTTPClient(4)
		defer client.CloseIdleConnections()
		if st, b, err := benchPost(ctx, client, benchDeliverURL(c.addr), benchMessageBody("warm", 64)); err != nil || st != 202 {
			return fmt.Errorf("warm-up: %v %s", err, b)
		}
		time.Sleep(500 * time.Millisecond)
		mw, err := e.watchMemory(ctx, c, "")
		if err != nil {
			return err
		}
		ictx, cancel := context.WithCancel(ctx)
		defer cancel()
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			idle      []*benchSSE
			connErrs  atomic.Int64
			firstErr  error
			heard     atomic.Int64 // data frames an idle reader got: should be none
			connected sync.WaitGroup
		)
		began := time.Now()
		sem := make(chan struct{}, 128)
		for i := range n {
			wg.Add(1)
			connected.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				session := fmt.Sprintf("idle-%d", i/idlePerConv)
				sc, err := openBenchSSE(ictx, c.addr, benchStreamPath(session, "0"), 512)
				var ev benchSSEEvent
				if err == nil {
					err = sc.next(&ev) // ": connected"
				}
				<-sem
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
				mu.Lock()
				idle = append(idle, sc)
				mu.Unlock()
				for sc.next(&ev) == nil {
					if !ev.comment {
						heard.Add(1)
					}
				}
			}()
		}
		connected.Wait()
		connectTime := time.Since(began)
		e.logf("idle readers: %d connected in %s (%d failed)", n-int(connErrs.Load()), connectTime.Round(time.Millisecond), connErrs.Load())
		defer func() {
			cancel()
			mu.Lock()
			for _, sc := range idle {
				sc.Close()
			}
			mu.Unlock()
			wg.Wait()
		}()
		if int(connErrs.Load()) == n {
			return fmt.Errorf("no idle reader connected: %v", firstErr)
		}
		write := func(ctx context.Context) error {
			return e.fanoutWrites(ctx, client, benchDeliverURL(c.addr), "hot")
		}
		tail := func(ctx context.Context) (string, error) { return benchConvlogTail(ctx, client, c.addr, "hot") }
		res, err := e.runFanout(ctx, c.addr, "hot", idleHotReader, write, tail, func(phase string) { mw.measure(ctx, phase) })
		if err != nil {
			return err
		}
		readers := n - int(connErrs.Load()) + idleHotReader - res.connectErrs
		kib, desc := mw.perReader(readers)
		e.rep.set("fan.idle.kib", kib)
		e.rep.set("fan.idle.readers", float64(n))
		key := "fan.idle"
		extra := fmt.Sprintf("%s; idle readers connected in %s", desc, connectTime.Round(time.Millisecond))
		if n < idleTarget && !e.opts.quick {
			extra += fmt.Sprintf("; **%s, not %s: the hard limit on open files is %d per process here (`ulimit -Hn`, not raisable without CAP_SYS_RESOURCE)**, and each reader takes a descriptor in the service and one in the generator",
				fmtCount(float64(n)), fmtCount(idleTarget), e.nofile)
		}
		if c := connErrs.Load(); c > 0 {
			extra += fmt.Sprintf("; %d idle readers failed to connect (%s)", c, benchOneLine(fmt.Sprint(firstErr)))
		}
		if h := heard.Load(); h > 0 {
			extra += fmt.Sprintf("; **idle readers got %d data frames**", h)
		}
		if res.behind > 0 {
			extra += fmt.Sprintf("; **%d hot readers had not reached the tail 60 s after the last write**", res.behind)
		}
		e.rep.add(benchRow{section: secBenchFanout, workload: e.idleWorkload(n), system: "convlog",
			lat: e.rep.latVals(key, res.lat), other: extra})
		e.logf("idle %d + hot %d: p50 %s p99 %s, %.1f KiB/reader", n, idleHotReader, fmtMS(res.lat.p50), fmtMS(res.lat.p99), kib)
		return nil
	})
}
