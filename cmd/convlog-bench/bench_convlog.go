package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// The convlog side of each scenario. Deliveries go to the echo agent
// (the one built in) at zero delay, so what is measured is the service's
// own work: HTTP, the durable admission, the JetStream doorbell, the turn's
// two writes, the deltas, the fan-out.

const (
	benchAgent    = "echo"
	benchInstance = "bench"
)

func benchDeliverURL(addr string) string {
	return "http://" + addr + "/agents/" + benchAgent + "/" + benchInstance
}

func benchConvURL(addr, session string, offset string, limit int) string {
	q := url.Values{"session": {session}, "offset": {offset}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	return "http://" + addr + "/agents/" + benchAgent + "/" + benchInstance + "/conversation?" + q.Encode()
}

func benchStreamPath(session, offset string) string {
	return "/agents/" + benchAgent + "/" + benchInstance + "/stream?" + url.Values{"session": {session}, "offset": {offset}}.Encode()
}

// profileDuring starts a CPU profile of the child for d when profiles are
// asked for; wait blocks until it is written.
func (e *benchEnv) profileDuring(ctx context.Context, c *benchChild, d time.Duration, name string) (wait func()) {
	path := e.profilePath(name)
	if path == "" {
		return func() {}
	}
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		// A 2-second execution trace from the middle of the window: where
		// goroutines wait (runnable, syscall, blocked).
		time.Sleep(d/2 - time.Second)
		tpath := strings.TrimSuffix(path, ".cpu.pprof") + ".trace"
		if err := c.fetch(ctx, "/debug/pprof/trace?seconds=2", tpath); err != nil {
			e.logf("trace %s: %v", name, err)
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		if err := c.profile(ctx, d, path); err != nil {
			e.logf("profile %s: %v", name, err)
		} else {
			e.logf("profile written: %s", path)
		}
	}()
	return func() { <-done; <-done }
}

// ---- 1. Admission ----

const secBenchAdmission = "1. Admission"

func (e *benchEnv) admissionWorkload() string {
	return fmt.Sprintf("POST → 202, %d keep-alive clients, %d B bodies, %s closed loop", e.sz.clients, e.sz.bodyBytes, e.sz.window)
}

// admission runs the admission workload in interleaved rounds — the bare
// bbolt ceiling, convlog, then each baseline, again and again — so that a
// neighbour's burst on this shared machine hits every system alike. Each
// system's throughput is its median round; its latencies pool every
// round's samples; the ratio to the ceiling is the median of the per-round
// ratios.
func (e *benchEnv) admission(ctx context.Context) error {
	type acc struct {
		rates, ratios []float64
		samples       []time.Duration
		errs          int
		firstErr      error
		note          string
		failed        error
	}
	accs := map[string]*acc{}
	get := func(sys string) *acc {
		if accs[sys] == nil {
			accs[sys] = &acc{}
		}
		return accs[sys]
	}
	add := func(sys string, res benchResult) {
		a := get(sys)
		a.rates = append(a.rates, res.rate())
		a.samples = append(a.samples, res.samples...)
		a.errs += res.errs
		if a.firstErr == nil {
			a.firstErr = res.firstErr
		}
	}
	var errs []error
	for round := range e.sz.admissionRounds {
		if ctx.Err() != nil {
			break
		}
		ceiling, err := e.bboltCeiling(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("bbolt: %w", err))
		} else {
			add("bbolt", ceiling)
		}
		err = e.withService(ctx, "admission", nil, func(c *benchChild) error {
			var res benchResult
			var err error
			stats := benchCommitsDuring(ctx, c, e.sz.window, func() {
				res, err = e.runAdmission(ctx, benchDeliverURL(c.addr), c, func() func() {
					if round > 0 {
						return nil
					}
					return e.profileDuring(ctx, c, e.sz.window, "admission.cpu.pprof")
				})
			})
			if err != nil {
				return err
			}
			add("convlog", res)
			a := get("convlog")
			if a.note == "" {
				a.note = "round 1: log " + stats + "; " + res.note
			}
			if ceiling.ok > 0 {
				a.ratios = append(a.ratios, res.rate()/ceiling.rate())
			}
			e.logf("admission round %d convlog: %s POST/s p99 %s, bbolt %s puts/s, %s", round+1, fmtCount(res.rate()), fmtMS(res.lat.p99), fmtCount(ceiling.rate()), stats)
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("convlog: %w", err))
		}
		if !e.opts.baselines {
			continue
		}
		for _, sys := range benchBaselines {
			if get(sys).failed != nil {
				continue
			}
			berr := e.withBaseline(ctx, sys, func(b *benchBaselineServer) error {
				res, err := e.runAdmission(ctx, "http://"+b.addr+"/agents/"+benchAgent+"/"+benchInstance, b.child, nil)
				if err != nil {
					return err
				}
				add(sys, res)
				if get(sys).note == "" {
					get(sys).note = b.store.durability() + "; round 1: " + res.note + " (the database's own processes not counted)"
				}
				e.logf("admission round %d %s: %s POST/s p99 %s", round+1, sys, fmtCount(res.rate()), fmtMS(res.lat.p99))
				return nil
			})
			if berr != nil {
				get(sys).failed = berr
			}
		}
	}
	rounds := func(a *acc) string {
		if len(a.rates) < 2 {
			return ""
		}
		sorted := slices.Clone(a.rates)
		slices.Sort(sorted)
		return fmt.Sprintf("median of %d rounds (%s–%s); ", len(a.rates), fmtCount(sorted[0]), fmtCount(sorted[len(sorted)-1]))
	}
	for _, sys := range append([]string{"bbolt", "convlog"}, benchBaselines...) {
		a := accs[sys]
		if a == nil {
			continue
		}
		if a.failed != nil && len(a.rates) == 0 {
			e.rep.unavailable(secBenchAdmission, e.admissionWorkload(), benchSystemLabel(sys), a.failed)
			continue
		}
		if len(a.rates) == 0 {
			continue
		}
		res := benchResult{lat: benchSummarize(a.samples), errs: a.errs, firstErr: a.firstErr}
		rate := median(a.rates)
		if sys == "bbolt" {
			e.rep.set("adm.bbolt.rate", rate)
			e.rep.add(benchRow{section: secBenchAdmission, workload: fmt.Sprintf("bare bbolt group commit, %d writers, 256 B, %s (the ceiling, measured next to each convlog round)", e.sz.clients, e.sz.ceilingWindow),
				system: "bbolt", lat: e.rep.latVals("adm.bbolt", res.lat), rate: rate, unit: "puts/s", other: rounds(a) + "fsync per commit"})
			continue
		}
		if sys == "convlog" {
			if len(a.ratios) > 0 {
				e.rep.set("adm.ratio.bbolt", median(a.ratios))
			}
			a.note = "fsync before 202; the echo agent answers every message meanwhile (a turn: 2 more writes, 32 deltas); " + a.note
		}
		e.recordAdmission(sys, rate, res, rounds(a)+a.note)
	}

	// The same load with the agent parked: each session's first turn
	// sleeps, so the workers write nothing more and what remains is the
	// admission path itself (HTTP, decoding, the durable Admit, the
	// JetStream doorbell). A diagnostic of where the time goes, one round.
	perr := e.withServiceDelay(ctx, "admission-parked", nil, time.Hour, func(c *benchChild) error {
		var res benchResult
		var err error
		stats := benchCommitsDuring(ctx, c, e.sz.window, func() {
			res, err = e.runAdmission(ctx, benchDeliverURL(c.addr), c, func() func() {
				return e.profileDuring(ctx, c, e.sz.window, "admission-parked.cpu.pprof")
			})
		})
		if err != nil {
			return err
		}
		e.recordAdmission("convlog-parked", res.rate(), res, "diagnostic, one round: the agent parked (first turn per session sleeps), so no turn writes compete; log: "+stats+"; "+res.note)
		return nil
	})
	if perr != nil {
		errs = append(errs, fmt.Errorf("parked: %w", perr))
	}
	return errors.Join(errs...)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// benchCommitsDuring wraps a measurement with the child's commit counters and
// returns a description: commits/s and writes per commit.
func benchCommitsDuring(ctx context.Context, c *benchChild, window time.Duration, run func()) string {
	c0, w0, err0 := c.commitStats(ctx)
	t0 := time.Now()
	run()
	el := time.Since(t0)
	c1, w1, err1 := c.commitStats(ctx)
	if err0 != nil || err1 != nil || c1 == c0 {
		return ""
	}
	return fmt.Sprintf("%s commits/s, %.1f writes/commit", fmtCount(float64(c1-c0)/el.Seconds()), float64(w1-w0)/float64(c1-c0))
}

// runAdmission runs the closed-loop admission load against url. With
// server (the server's process) set, the result's note says how many cores
// the server and this load generator used meanwhile.
func (e *benchEnv) runAdmission(ctx context.Context, url string, server *benchChild, profile func() func()) (benchResult, error) {
	client := benchHTTPClient(e.sz.clients)
	defer client.CloseIdleConnections()
	bodies := make([][]byte, e.sz.clients)
	for i := range bodies {
		bodies[i] = benchMessageBody(fmt.Sprintf("adm-%d", i), e.sz.bodyBytes)
	}
	waitc := make(chan func(), 1)
	if profile != nil {
		go func() {
			time.Sleep(e.sz.warmup)
			waitc <- profile()
		}()
	} else {
		waitc <- nil
	}
	var srv0, self0 float64
	if server != nil {
		srv0, _ = benchCPUSeconds(server.pid())
		self0, _ = benchCPUSeconds(os.Getpid())
	}
	t0 := time.Now()
	res := benchClosedLoop(ctx, e.sz.clients, e.sz.warmup, e.sz.window, 0, func(w int) error {
		st, b, err := benchPost(ctx, client, url, bodies[w])
		if err != nil {
			return err
		}
		return benchWantStatus(st, http.StatusAccepted, b)
	})
	if server != nil {
		wall := time.Since(t0).Seconds()
		srv1, err1 := benchCPUSeconds(server.pid())
		self1, err2 := benchCPUSeconds(os.Getpid())
		if err1 == nil && err2 == nil {
			res.note = fmt.Sprintf("CPU meanwhile: server %.2f cores, load generator %.2f cores (of 2)", (srv1-srv0)/wall, (self1-self0)/wall)
		}
	}
	if wait := <-waitc; wait != nil {
		wait()
	}
	if res.ok == 0 {
		return res, fmt.Errorf("no request succeeded: %v", res.firstErr)
	}
	return res, nil
}

func (e *benchEnv) recordAdmission(sys string, rate float64, res benchResult, note string) {
	key := "adm." + sys
	e.rep.set(key+".rate", rate)
	other := note
	if res.errs > 0 {
		other += fmt.Sprintf("; %d errors (first: %s)", res.errs, benchOneLine(fmt.Sprint(res.firstErr)))
	}
	e.rep.add(benchRow{section: secBenchAdmission, workload: e.admissionWorkload(), system: benchSystemLabel(sys),
		lat: e.rep.latVals(key, res.lat), rate: rate, unit: "POST/s", other: other})
	e.logf("admission %s: %s POST/s p50 %s p99 %s", sys, fmtCount(rate), fmtMS(res.lat.p50), fmtMS(res.lat.p99))
}

// ---- Offered load (the chart) ----

func (e *benchEnv) offeredLoad(ctx context.Context) error {
	run := func(sys, url string) {
		client := benchHTTPClient(1024)
		defer client.CloseIdleConnections()
		bodies := make([][]byte, 256)
		for i := range bodies {
			bodies[i] = benchMessageBody(fmt.Sprintf("load-%d", i), e.sz.bodyBytes)
		}
		op := func(i int) error {
			st, b, err := benchPost(ctx, client, url, bodies[i%len(bodies)])
			if err != nil {
				return err
			}
			return benchWantStatus(st, http.StatusAccepted, b)
		}
		// Warm up (connections, pools, first streams), unmeasured.
		benchOpenLoop(ctx, e.sz.loadRates[0], e.sz.warmup, 1024, op)
		for _, rate := range e.sz.loadRates {
			if ctx.Err() != nil {
				return
			}
			res := benchOpenLoop(ctx, rate, e.sz.loadStep, 1024, op)
			p := benchLoadPoint{system: benchSystemLabel(sys), offered: rate, achieved: res.rate(), p50: res.lat.p50, p99: res.lat.p99, max: res.lat.max, dropped: res.dropped, errs: res.errs}
			e.rep.mu.Lock()
			e.rep.load = append(e.rep.load, p)
			e.rep.mu.Unlock()
			e.logf("load %s %d/s: achieved %s p50 %s p99 %s dropped %d errors %d", sys, rate, fmtCount(p.achieved), fmtMS(p.p50), fmtMS(p.p99), p.dropped, p.errs)
			time.Sleep(e.sz.loadStep / 4) // let a backlog drain between steps
		}
	}
	err := e.withService(ctx, "load", nil, func(c *benchChild) error {
		run("convlog", benchDeliverURL(c.addr))
		return nil
	})
	if e.opts.baselines {
		for _, sys := range benchBaselines {
			if berr := e.withBaseline(ctx, sys, func(b *benchBaselineServer) error {
				run(sys, "http://"+b.addr+"/agents/"+benchAgent+"/"+benchInstance)
				return nil
			}); berr != nil {
				e.rep.note("offered load against %s: unavailable: %s", benchSystemLabel(sys), benchOneLine(berr.Error()))
			}
		}
	}
	return err
}

// ---- 2. End to end ----

const secBenchE2E = "2. End to end"

// benchFrameAt is an SSE frame of interest and when it arrived.
type benchFrameAt struct {
	at      time.Time
	delta   bool
	settled bool
	data    []byte
	err     error
}

var benchSettlementType = []byte(`"type":"settlement"`)

func (e *benchEnv) endToEnd(ctx context.Context) error {
	return e.withService(ctx, "e2e", nil, func(c *benchChild) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		sc, err := openBenchSSE(ctx, c.addr, benchStreamPath("e2e", "0"), 64<<10)
		if err != nil {
			return err
		}
		defer sc.Close()
		frames := make(chan benchFrameAt, 4096)
		go func() {
			defer close(frames)
			var ev benchSSEEvent
			for {
				if err := sc.next(&ev); err != nil {
					if ctx.Err() == nil {
						frames <- benchFrameAt{err: err}
					}
					return
				}
				now := time.Now()
				if ev.comment {
					continue
				}
				f := benchFrameAt{at: now}
				switch {
				case bytes.HasPrefix(ev.data, benchDeltaPrefix):
					f.delta = true
				case bytes.HasPrefix(ev.data, benchConvPrefix):
					f.settled = bytes.Contains(ev.data, benchSettlementType)
				default:
					continue
				}
				f.data = bytes.Clone(ev.data)
				select {
				case frames <- f:
				case <-ctx.Done():
					return
				}
			}
		}()
		client := benchHTTPClient(4)
		defer client.CloseIdleConnections()
		body := benchMessageBody("e2e", e.sz.bodyBytes)
		warm := max(10, e.sz.e2eRuns/20)
		var admit, delta, settle, after202 []time.Duration
		for i := 0; i < e.sz.e2eRuns+warm; i++ {
			t0 := time.Now()
			st, b, err := benchPost(ctx, client, benchDeliverURL(c.addr), body)
			t202 := time.Now()
			if err != nil {
				return err
			}
			if err := benchWantStatus(st, http.StatusAccepted, b); err != nil {
				return err
			}
			var acc struct {
				SubmissionID string `json:"submissionId"`
			}
			if err := json.Unmarshal(b, &acc); err != nil {
				return err
			}
			id := []byte(acc.SubmissionID)
			var tDelta, tSettle time.Time
			for tSettle.IsZero() {
				var f benchFrameAt
				select {
				case f = <-frames:
				case <-time.After(30 * time.Second):
					return fmt.Errorf("no settlement of %s within 30s", acc.SubmissionID)
				}
				if f.err != nil {
					return fmt.Errorf("stream: %w", f.err)
				}
				if !bytes.Contains(f.data, id) {
					continue
				}
				if f.delta && tDelta.IsZero() {
					tDelta = f.at
				}
				if f.settled {
					tSettle = f.at
				}
			}
			if i < warm {
				continue
			}
			admit = append(admit, t202.Sub(t0))
			if !tDelta.IsZero() {
				delta = append(delta, tDelta.Sub(t0))
				after202 = append(after202, max(0, tDelta.Sub(t202)))
			}
			settle = append(settle, tSettle.Sub(t0))
		}
		w := fmt.Sprintf("one client, one session, %d sequential turns, echo delay 0, %d B message", e.sz.e2eRuns, e.sz.bodyBytes)
		la, ld, ls := benchSummarize(admit), benchSummarize(delta), benchSummarize(settle)
		e.rep.add(benchRow{section: secBenchE2E, workload: "POST → 202 (unloaded); " + w, system: "convlog", lat: e.rep.latVals("e2e.202", la)})
		e.rep.add(benchRow{section: secBenchE2E, workload: "POST → first SSE delta frame", system: "convlog", lat: e.rep.latVals("e2e.delta", ld),
			other: fmt.Sprintf("%d of %d turns had a delta before their records", len(delta), len(settle))})
		e.rep.add(benchRow{section: secBenchE2E, workload: "POST → settlement record on SSE", system: "convlog", lat: e.rep.latVals("e2e.settle", ls)})
		e.rep.add(benchRow{section: secBenchE2E, workload: "202 → first delta (relay to JetStream, consumer, the turn's Start commit, prompt read, NATS delta)", system: "convlog",
			lat: e.rep.latVals("e2e.after202", benchSummarize(after202)), other: "0 when the delta beat the 202 to the client"})
		e.logf("e2e: 202 p50 %s, first delta p50 %s p99 %s, settlement p50 %s p99 %s", fmtMS(la.p50), fmtMS(ld.p50), fmtMS(ld.p99), fmtMS(ls.p50), fmtMS(ls.p99))
		return nil
	})
}

// ---- 3. Fan-out ----

const secBenchFanout = "3. Fan-out"

// benchFanout is what the readers saw.
type benchFanout struct {
	lat         benchLatency
	connectTime time.Duration
	behind      int // readers that did not reach the tail in time
	deltas      int64
	frames      int64
	perReader   float64 // KiB, convlog only
	connectErrs int
	firstErr    error
}

// runFanout opens n readers of session on addr from offset 0, then has
// write() append while they read; each durable frame's latency is its
// arrival minus its first record's timestamp (taken in the committing
// transaction). tail() says where the stream ends after the writes.
func (e *benchEnv) runFanout(ctx context.Context, addr, session string, n int, write func(ctx context.Context) error, tail func(ctx context.Context) (string, error), measure func(phase string)) (benchFanout, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var res benchFanout
	readers := make([]*benchSSE, n)
	var (
		connected sync.WaitGroup
		mu        sync.Mutex
		all       = make([]time.Duration, 0, n*e.sz.fanoutWrites*2)
		deltas    atomic.Int64
		frames    atomic.Int64
		connErrs  atomic.Int64
		firstErr  error
		lastIDs   = make([]atomic.Value, n)
		readersWG sync.WaitGroup
	)
	start := time.Now()
	sem := make(chan struct{}, 128)
	for i := range n {
		connected.Add(1)
		readersWG.Add(1)
		sem <- struct{}{}
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
			local := make([]time.Duration, 0, e.sz.fanoutWrites*2)
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
	e.logf("fan-out %d readers: connected in %s (%d failed)", n, res.connectTime.Round(time.Millisecond), res.connectErrs)
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
		return res, fmt.Errorf("no reader connected: %v", firstErr)
	}
	if measure != nil {
		time.Sleep(time.Second)
		measure("connected")
	}
	if err := write(ctx); err != nil {
		closeAll()
		return res, err
	}
	want, err := tail(ctx)
	if err != nil {
		closeAll()
		return res, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		behind := 0
		for i := range lastIDs {
			if readers[i] == nil {
				continue
			}
			if v, _ := lastIDs[i].Load().(string); v != want {
				behind++
			}
		}
		res.behind = behind
		if behind == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if measure != nil {
		measure("delivered")
	}
	closeAll()
	res.lat = benchSummarize(all)
	res.deltas, res.frames = deltas.Load(), frames.Load()
	res.firstErr = firstErr
	return res, nil
}

func (e *benchEnv) fanoutWorkload(n int) string {
	return fmt.Sprintf("%s SSE readers of one conversation; %d POSTs every %s; append → each reader", fmtCount(float64(n)), e.sz.fanoutWrites, e.sz.fanoutEvery)
}

// benchMemWatch reads a server's memory before, at and after a fan-out.
type benchMemWatch struct {
	e                                *benchEnv
	c                                *benchChild
	name                             string // for heap profiles; "" for none
	rss0, rssConnected, rssDelivered int64
	mem0, memConnected, memDelivered benchMem
}

func (e *benchEnv) watchMemory(ctx context.Context, c *benchChild, name string) (*benchMemWatch, error) {
	w := &benchMemWatch{e: e, c: c, name: name}
	var err error
	if w.rss0, err = c.rssKiB(ctx); err != nil {
		return nil, err
	}
	w.mem0, _ = c.memStats(ctx)
	return w, nil
}

func (w *benchMemWatch) measure(ctx context.Context, phase string) {
	v, err := w.c.rssKiB(ctx)
	if err != nil {
		w.e.logf("rss: %v", err)
		return
	}
	m, _ := w.c.memStats(ctx)
	if phase == "connected" {
		w.rssConnected, w.memConnected = v, m
	} else {
		w.rssDelivered, w.memDelivered = v, m
	}
	if w.name != "" && w.e.opts.profile != "" {
		_ = w.c.fetch(ctx, "/debug/pprof/heap", w.e.profilePath(w.name+"-"+phase+".heap.pprof"))
	}
}

// perReader is the resident memory each reader added, in KiB, and a
// description with the heap and goroutine-stack shares.
func (w *benchMemWatch) perReader(readers int) (float64, string) {
	n := float64(max(readers, 1))
	kib := float64(max(w.rssConnected, w.rssDelivered)-w.rss0) / n
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / 1024 / n }
	return kib, fmt.Sprintf("server RSS %s MiB idle → %s MiB connected → %s MiB delivered: **%.1f KiB/reader** "+
		"(per reader, connected / delivered: heap %.1f / %.1f KiB, goroutine stacks %.1f / %.1f KiB)",
		benchMiB(w.rss0), benchMiB(w.rssConnected), benchMiB(w.rssDelivered), kib,
		per(w.memConnected.heapInuse, w.mem0.heapInuse), per(w.memDelivered.heapInuse, w.mem0.heapInuse),
		per(w.memConnected.stackInuse, w.mem0.stackInuse), per(w.memDelivered.stackInuse, w.mem0.stackInuse))
}

func (e *benchEnv) fanout(ctx context.Context) error {
	var errs []error
	largest := e.sz.fanout[len(e.sz.fanout)-1]
	for _, n := range e.sz.fanout {
		err := e.withService(ctx, fmt.Sprintf("fanout-%d", n), nil, func(c *benchChild) error {
			client := benchHTTPClient(4)
			defer client.CloseIdleConnections()
			// Warm the service (NATS consumer, first stream) before the
			// idle memory reading.
			if st, b, err := benchPost(ctx, client, benchDeliverURL(c.addr), benchMessageBody("warm", 64)); err != nil || st != http.StatusAccepted {
				return fmt.Errorf("warm-up: %v %s", err, b)
			}
			time.Sleep(500 * time.Millisecond)
			name := ""
			if n == largest {
				name = fmt.Sprintf("fanout-%d", n)
			}
			mw, err := e.watchMemory(ctx, c, name)
			if err != nil {
				return err
			}
			var waitProfile func()
			// The profile outlives the writes' context, which ends with them.
			profileCtx := ctx
			write := func(ctx context.Context) error {
				if n == largest {
					waitProfile = e.profileDuring(profileCtx, c, time.Duration(e.sz.fanoutWrites)*e.sz.fanoutEvery+time.Second, fmt.Sprintf("fanout-%d.cpu.pprof", n))
				}
				return e.fanoutWrites(ctx, client, benchDeliverURL(c.addr), "fan")
			}
			tail := func(ctx context.Context) (string, error) { return benchConvlogTail(ctx, client, c.addr, "fan") }
			// Socket writes between connected and delivered: per reader per
			// POST, 1 is the floor's shape; more is frames of one POST that
			// left in separate writes.
			var writesAt [2]uint64
			res, err := e.runFanout(ctx, c.addr, "fan", n, write, tail, func(phase string) {
				mw.measure(ctx, phase)
				i := 0
				if phase == "delivered" {
					i = 1
				}
				writesAt[i], _, _ = c.streamWrites(ctx)
			})
			if waitProfile != nil {
				waitProfile()
			}
			if err != nil {
				return err
			}
			kib, desc := mw.perReader(n - res.connectErrs)
			if readers := n - res.connectErrs; writesAt[1] > writesAt[0] && readers > 0 {
				perPost := float64(writesAt[1]-writesAt[0]) / float64(readers*e.sz.fanoutWrites)
				desc += fmt.Sprintf("; %.2f socket writes per reader per POST", perPost)
				e.rep.set(fmt.Sprintf("fan.convlog.%d.writes", n), perPost)
			}
			res.perReader = kib
			e.recordFanout("convlog", n, res, desc)
			e.rep.set(fmt.Sprintf("fan.convlog.%d.kib", n), kib)
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("%d readers: %w", n, err))
		}
	}
	if e.opts.readers > 0 {
		// A focused run: one conversation at one size.
	} else {
		if err := e.fanoutMany(ctx); err != nil {
			errs = append(errs, fmt.Errorf("across conversations: %w", err))
		}
		if err := e.fanoutIdle(ctx); err != nil {
			errs = append(errs, fmt.Errorf("idle readers: %w", err))
		}
	}
	// The floor at every size: the 10,000-reader target is a ratio to it,
	// measured in the same run.
	for _, n := range e.sz.fanout {
		ferr := e.withBaseline(ctx, "floor", func(b *benchBaselineServer) error {
			client := benchHTTPClient(4)
			defer client.CloseIdleConnections()
			mw, err := e.watchMemory(ctx, b.child, "")
			if err != nil {
				return err
			}
			write := func(ctx context.Context) error {
				return e.fanoutWrites(ctx, client, "http://"+b.addr+"/agents/"+benchAgent+"/"+benchInstance, "fan")
			}
			tail := func(ctx context.Context) (string, error) { return benchFloorTail(ctx, client, b.addr, "fan") }
			res, err := e.runFanout(ctx, b.addr, "fan", n, write, tail, func(phase string) { mw.measure(ctx, phase) })
			if err != nil {
				return err
			}
			kib, desc := mw.perReader(n - res.connectErrs)
			e.rep.set(fmt.Sprintf("fan.floor.%d.kib", n), kib)
			e.recordFanout("floor", n, res, b.store.tailing()+"; "+desc)
			return nil
		})
		if ferr != nil {
			errs = append(errs, fmt.Errorf("floor, %d readers: %w", n, ferr))
		}
	}
	if e.opts.baselines {
		for _, sys := range benchBaselines {
			for _, n := range e.sz.fanoutBaseline {
				berr := e.withBaseline(ctx, sys, func(b *benchBaselineServer) error {
					client := benchHTTPClient(4)
					defer client.CloseIdleConnections()
					mw, err := e.watchMemory(ctx, b.child, "")
					if err != nil {
						return err
					}
					write := func(ctx context.Context) error {
						return e.fanoutWrites(ctx, client, "http://"+b.addr+"/agents/"+benchAgent+"/"+benchInstance, "fan")
					}
					tail := func(ctx context.Context) (string, error) { return b.store.tail(ctx, "fan") }
					res, err := e.runFanout(ctx, b.addr, "fan", n, write, tail, func(phase string) { mw.measure(ctx, phase) })
					if err != nil {
						return err
					}
					kib, desc := mw.perReader(n - res.connectErrs)
					e.rep.set(fmt.Sprintf("fan.%s.%d.kib", sys, n), kib)
					e.recordFanout(sys, n, res, b.store.tailing()+"; no agent, so one frame per POST (convlog: two, plus deltas); "+desc)
					return nil
				})
				if berr != nil {
					e.rep.unavailable(secBenchFanout, e.fanoutWorkload(n), benchSystemLabel(sys), berr)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func benchMiB(kib int64) string { return fmt.Sprintf("%.0f", float64(kib)/1024) }

func (e *benchEnv) recordFanout(sys string, n int, res benchFanout, other string) {
	key := fmt.Sprintf("fan.%s.%d", sys, n)
	extra := fmt.Sprintf("; connect %s", res.connectTime.Round(time.Millisecond))
	if res.connectErrs > 0 {
		extra += fmt.Sprintf("; %d readers failed to connect (%s)", res.connectErrs, benchOneLine(fmt.Sprint(res.firstErr)))
	}
	if res.behind > 0 {
		extra += fmt.Sprintf("; **%d readers had not reached the tail 60 s after the last write**", res.behind)
	}
	if res.deltas > 0 {
		extra += fmt.Sprintf("; %s deltas delivered", fmtCount(float64(res.deltas)))
	}
	e.rep.add(benchRow{section: secBenchFanout, workload: e.fanoutWorkload(n), system: benchSystemLabel(sys),
		lat: e.rep.latVals(key, res.lat), other: other + extra})
	e.logf("fan-out %s %d: %d frames p50 %s p99 %s max %s behind %d", sys, n, res.frames, fmtMS(res.lat.p50), fmtMS(res.lat.p99), fmtMS(res.lat.max), res.behind)
}

// fanoutWrites posts the fan-out's messages at its fixed pace.
func (e *benchEnv) fanoutWrites(ctx context.Context, client *http.Client, url, session string) error {
	t := time.NewTicker(e.sz.fanoutEvery)
	defer t.Stop()
	for i := range e.sz.fanoutWrites {
		body := []byte(fmt.Sprintf(`{"message":{"kind":"user","body":"fan out message %d"},"session":%q}`, i, session))
		st, b, err := benchPost(ctx, client, url, body)
		if err != nil {
			return err
		}
		if err := benchWantStatus(st, http.StatusAccepted, b); err != nil {
			return err
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// benchConvlogTail waits for the session's turns to settle and returns its tail.
func benchConvlogTail(ctx context.Context, client *http.Client, addr, session string) (string, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		off := "0"
		var res struct {
			Batches []struct {
				Records json.RawMessage `json:"records"`
			} `json:"batches"`
			NextOffset string `json:"nextOffset"`
			UpToDate   bool   `json:"upToDate"`
		}
		settled, users := 0, 0
		for {
			st, b, err := benchGet(ctx, client, benchConvURL(addr, session, off, 10000))
			if err != nil {
				return "", err
			}
			if err := benchWantStatus(st, http.StatusOK, b); err != nil {
				return "", err
			}
			if err := json.Unmarshal(b, &res); err != nil {
				return "", err
			}
			for _, bt := range res.Batches {
				settled += bytes.Count(bt.Records, benchSettlementType)
				users += bytes.Count(bt.Records, []byte(`"type":"user_message"`))
			}
			off = res.NextOffset
			if res.UpToDate {
				break
			}
		}
		if settled == users {
			return off, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("session %s: turns not settled after 60s", session)
}

// ---- 4. Catch-up ----

const secBenchCatchup = "4. Catch-up"

// catchupRecord is a record of about 256 bytes as stored, the same shape
// as log/bench_test.go's.
func benchCatchupPayload() json.RawMessage {
	text := bytes.Repeat([]byte("x"), 256-150)
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: string(text)}}})
	return p
}

const benchCatchupPerBatch = 10

// benchBuildCatchup writes a records-record conversation straight into a log
// file, in batches of benchCatchupPerBatch, before the service opens it.
func benchBuildCatchup(dir string, records int) error {
	db, err := clog.Open(filepath.Join(dir, "convlog.db"), nil)
	if err != nil {
		return err
	}
	key := record.Key{Agent: benchAgent, Instance: benchInstance, Session: "catchup"}
	payload := benchCatchupPayload()
	var next atomic.Int64
	var wg sync.WaitGroup
	var first atomic.Value
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs := make([]record.Record, benchCatchupPerBatch)
			for next.Add(benchCatchupPerBatch) <= int64(records) {
				for j := range recs {
					recs[j] = record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: payload})
				}
				if _, err := db.Append(context.Background(), key, recs...); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	cerr := db.Close()
	if err, _ := first.Load().(error); err != nil {
		return err
	}
	return cerr
}

// benchCatchup is one read of the whole conversation.
type benchCatchup struct {
	records int
	bytes   int64
	elapsed time.Duration
	pages   []time.Duration
}

func (r benchCatchup) rps() float64  { return float64(r.records) / r.elapsed.Seconds() }
func (r benchCatchup) mbps() float64 { return float64(r.bytes) / r.elapsed.Seconds() / 1e6 }

var benchNextOffsetKey = []byte(`"nextOffset":"`)

// benchPollAll reads the conversation from "0" page by page until upToDate.
// It finds nextOffset and upToDate at the end of each body without
// decoding the records.
func benchPollAll(ctx context.Context, client *http.Client, pageURL func(offset string) string, want string) (benchCatchup, error) {
	var r benchCatchup
	off := "0"
	start := time.Now()
	for range 1_000_000 {
		t0 := time.Now()
		st, b, err := benchGet(ctx, client, pageURL(off))
		if err != nil {
			return r, err
		}
		if err := benchWantStatus(st, http.StatusOK, b); err != nil {
			return r, err
		}
		r.pages = append(r.pages, time.Since(t0))
		r.bytes += int64(len(b))
		i := bytes.LastIndex(b, benchNextOffsetKey)
		if i < 0 {
			return r, errors.New("no nextOffset in page")
		}
		rest := b[i+len(benchNextOffsetKey):]
		j := bytes.IndexByte(rest, '"')
		if j < 0 {
			return r, errors.New("bad nextOffset")
		}
		off = string(rest[:j])
		if bytes.HasSuffix(bytes.TrimSpace(b), []byte(`"upToDate":true}`)) || off == want {
			break
		}
	}
	r.elapsed = time.Since(start)
	if off != want {
		return r, fmt.Errorf("polling ended at offset %s, want %s", off, want)
	}
	return r, nil
}

// benchSSEAll reads the conversation from "0" over SSE until the frame whose
// id is want.
func benchSSEAll(ctx context.Context, addr, path, want string) (benchCatchup, error) {
	var r benchCatchup
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	sc, err := openBenchSSE(ctx, addr, path, 64<<10)
	if err != nil {
		return r, err
	}
	defer sc.Close()
	stop := context.AfterFunc(ctx, func() { sc.Close() })
	defer stop()
	var ev benchSSEEvent
	for {
		if err := sc.next(&ev); err != nil {
			return r, fmt.Errorf("after %d bytes: %w", sc.bytes, err)
		}
		if string(ev.id) == want {
			break
		}
	}
	r.elapsed = time.Since(start)
	r.bytes = sc.bytes
	return r, nil
}

func (e *benchEnv) catchupWorkload(over string) string {
	return fmt.Sprintf("%s-record conversation (%d-record batches, ~256 B records) from offset 0 over %s", fmtCount(float64(e.sz.catchup)), benchCatchupPerBatch, over)
}

// best of the passes (the least disturbed by the neighbours).
func benchBest(rs []benchCatchup) benchCatchup {
	b := rs[0]
	for _, r := range rs[1:] {
		if r.elapsed < b.elapsed {
			b = r
		}
	}
	return b
}

func (e *benchEnv) recordCatchup(sys, over string, rs []benchCatchup, other string) {
	b := benchBest(rs)
	b.records = e.sz.catchup
	key := fmt.Sprintf("catch.%s.%s", sys, over)
	e.rep.set(key+".rps", b.rps())
	e.rep.set(key+".mbps", b.mbps())
	var lat *benchLatency
	var all []time.Duration
	for _, r := range rs {
		all = append(all, r.pages...)
	}
	if len(all) > 0 {
		l := benchSummarize(all)
		lat = &l
		other = "; latencies are per page" + other
	}
	label := map[string]string{"json": "JSON polling (limit 10,000)", "sse": "SSE"}[over]
	e.rep.add(benchRow{section: secBenchCatchup, workload: e.catchupWorkload(label), system: benchSystemLabel(sys), lat: lat,
		rate: b.rps(), unit: "records/s", other: fmt.Sprintf("%.1f MB/s; whole read %s (best of %d)%s", b.mbps(), b.elapsed.Round(time.Millisecond), len(rs), other)})
	e.logf("catch-up %s %s: %s records/s %.1f MB/s", sys, over, fmtCount(b.rps()), b.mbps())
}

// catchUpPasses reads the "catchup" conversation at addr whole, over JSON
// polling then over SSE, catchupPasses times each, up to offset want.
func (e *benchEnv) catchUpPasses(ctx context.Context, addr, want string) (polls, sses []benchCatchup, err error) {
	client := benchHTTPClient(2)
	defer client.CloseIdleConnections()
	for range e.sz.catchupPasses {
		r, err := benchPollAll(ctx, client, func(off string) string { return benchConvURL(addr, "catchup", off, 10000) }, want)
		if err != nil {
			return nil, nil, fmt.Errorf("polling: %w", err)
		}
		polls = append(polls, r)
	}
	for range e.sz.catchupPasses {
		r, err := benchSSEAll(ctx, addr, benchStreamPath("catchup", "0"), want)
		if err != nil {
			return nil, nil, fmt.Errorf("sse: %w", err)
		}
		sses = append(sses, r)
	}
	return polls, sses, nil
}

func (e *benchEnv) catchUp(ctx context.Context) error {
	want := strconv.Itoa(e.sz.catchup)
	err := e.withService(ctx, "catchup", func(dir string) error { return benchBuildCatchup(dir, e.sz.catchup) }, func(c *benchChild) error {
		polls, sses, err := e.catchUpPasses(ctx, c.addr, want)
		if err != nil {
			return err
		}
		if e.opts.profile != "" {
			// Unmeasured: repeat each read for 3 s under the profiler.
			const d = 3 * time.Second
			client := benchHTTPClient(2)
			defer client.CloseIdleConnections()
			wait := e.profileDuring(ctx, c, d, "catchup-json.cpu.pprof")
			for t0 := time.Now(); time.Since(t0) < d+500*time.Millisecond; {
				if _, err := benchPollAll(ctx, client, func(off string) string { return benchConvURL(c.addr, "catchup", off, 10000) }, want); err != nil {
					return err
				}
			}
			wait()
			wait = e.profileDuring(ctx, c, d, "catchup-sse.cpu.pprof")
			for t0 := time.Now(); time.Since(t0) < d+500*time.Millisecond; {
				if _, err := benchSSEAll(ctx, c.addr, benchStreamPath("catchup", "0"), want); err != nil {
					return err
				}
			}
			wait()
		}
		e.recordCatchup("convlog", "json", polls, "")
		e.recordCatchup("convlog", "sse", sses, "")
		return nil
	})
	if e.opts.baselines {
		for _, sys := range benchBaselines {
			berr := e.withBaseline(ctx, sys, func(b *benchBaselineServer) error {
				var rows []benchLoadRow
				for _, r := range benchCatchupRows(e.sz.catchup) {
					rows = append(rows, benchLoadRow{session: "catchup", records: r})
				}
				if err := b.store.load(ctx, rows); err != nil {
					return err
				}
				tail, err := b.store.tail(ctx, "catchup")
				if err != nil {
					return err
				}
				polls, sses, err := e.catchUpPasses(ctx, b.addr, tail)
				if err != nil {
					return err
				}
				e.recordCatchup(sys, "json", polls, "")
				e.recordCatchup(sys, "sse", sses, "")
				return nil
			})
			if berr != nil {
				e.rep.unavailable(secBenchCatchup, e.catchupWorkload("JSON polling and SSE"), benchSystemLabel(sys), berr)
			}
		}
	}
	return err
}

// benchCatchupRows are the conversation's batches as the baselines store them:
// the same JSON record arrays, one row per batch.
func benchCatchupRows(records int) [][]byte {
	payload := benchCatchupPayload()
	rows := make([][]byte, 0, records/benchCatchupPerBatch)
	now := time.Now().UTC()
	for i := 0; i < records; i += benchCatchupPerBatch {
		recs := make([]record.Record, benchCatchupPerBatch)
		for j := range recs {
			recs[j] = record.EntryRecord(record.Entry{ID: benchULID(), ParentID: "", Timestamp: now, Type: record.EntryUserMessage, Payload: payload})
		}
		b, _ := json.Marshal(recs)
		rows = append(rows, b)
	}
	return rows
}

// ---- 5. Many conversations ----

const secBenchSessions = "5. Many conversations"

func (e *benchEnv) sessionsWorkload(n int) string {
	return fmt.Sprintf("random whole-session reads (GET conversation from 0, 4 clients) after %s sessions × %d turns", fmtCount(float64(n)), e.sz.turns)
}

func (e *benchEnv) manySessions(ctx context.Context) error {
	err := e.withService(ctx, "sessions", nil, func(c *benchChild) error {
		client := benchHTTPClient(e.sz.sessionWorkers + 8)
		defer client.CloseIdleConnections()
		made := 0
		for _, n := range e.sz.sessions {
			t0 := time.Now()
			turns, err := e.populateSessions(ctx, client, c.addr, made, n)
			if err != nil {
				return err
			}
			popRate := float64(turns) / time.Since(t0).Seconds()
			made = n
			time.Sleep(time.Second) // let the relay and the last turns settle
			read := func(s int) error {
				st, b, err := benchGet(ctx, client, benchConvURL(c.addr, fmt.Sprintf("s-%d", s), "0", 0))
				if err != nil {
					return err
				}
				if err := benchWantStatus(st, http.StatusOK, b); err != nil {
					return err
				}
				if !bytes.HasSuffix(bytes.TrimSpace(b), []byte(`"upToDate":true}`)) {
					return errors.New("session read not up to date in one page")
				}
				return nil
			}
			last := n == e.sz.sessions[len(e.sz.sessions)-1]
			var wait func()
			if last {
				wait = e.profileDuring(ctx, c, 2*time.Second, "sessions-reads.cpu.pprof")
			}
			res := e.randomReads(ctx, n, read)
			e.recordSessions("convlog", n, res, fmt.Sprintf("built at %s turns/s (POST, then long-poll the submission until settled; %d clients)", fmtCount(popRate), e.sz.sessionWorkers))
			if wait != nil {
				wait()
			}
			if last && len(e.sz.sessions) > 1 {
				// The same reads confined to the first checkpoint's
				// sessions, at the same moment on the same file: what is
				// left of the difference is the size of the log, not the
				// machine's mood.
				few := e.sz.sessions[0]
				res := e.randomReads(ctx, few, read)
				key := fmt.Sprintf("sess.convlog.%d.%d", n, few)
				e.rep.add(benchRow{section: secBenchSessions, workload: fmt.Sprintf("the same reads confined to sessions 0–%d, right after, on the %s-session log", few-1, fmtCount(float64(n))),
					system: "convlog", lat: e.rep.latVals(key, res.lat), rate: res.rate(), unit: "reads/s", other: "separates the log's size from the time of the run"})
				e.logf("sessions convlog %d confined to %d: read p50 %s p99 %s", n, few, fmtMS(res.lat.p50), fmtMS(res.lat.p99))
			}
		}
		return nil
	})
	if e.opts.baselines {
		for _, sys := range benchBaselines {
			berr := e.withBaseline(ctx, sys, func(b *benchBaselineServer) error {
				client := benchHTTPClient(16)
				defer client.CloseIdleConnections()
				made := 0
				for _, n := range e.sz.sessions {
					var rows []benchLoadRow
					for s := made; s < n; s++ {
						for _, r := range benchSessionRows(e.sz.turns) {
							rows = append(rows, benchLoadRow{session: fmt.Sprintf("s-%d", s), records: r})
						}
					}
					if err := b.store.load(ctx, rows); err != nil {
						return err
					}
					made = n
					res := e.randomReads(ctx, n, func(s int) error {
						st, body, err := benchGet(ctx, client, benchConvURL(b.addr, fmt.Sprintf("s-%d", s), "0", 0))
						if err != nil {
							return err
						}
						return benchWantStatus(st, http.StatusOK, body)
					})
					e.recordSessions(sys, n, res, "rows loaded directly, same records (a user row and a reply row per turn)")
				}
				return nil
			})
			if berr != nil {
				e.rep.unavailable(secBenchSessions, e.sessionsWorkload(e.sz.sessions[len(e.sz.sessions)-1]), benchSystemLabel(sys), berr)
			}
		}
	}
	return err
}

func (e *benchEnv) randomReads(ctx context.Context, sessions int, read func(s int) error) benchResult {
	rngs := make([]*rand.Rand, 4)
	for i := range rngs {
		rngs[i] = rand.New(rand.NewPCG(uint64(i), uint64(sessions)))
	}
	return benchClosedLoop(ctx, 4, 200*time.Millisecond, 60*time.Second, e.sz.randomReads, func(w int) error {
		return read(rngs[w].IntN(sessions))
	})
}

func (e *benchEnv) recordSessions(sys string, n int, res benchResult, other string) {
	key := fmt.Sprintf("sess.%s.%d", sys, n)
	if res.errs > 0 {
		other += fmt.Sprintf("; %d errors (first: %s)", res.errs, benchOneLine(fmt.Sprint(res.firstErr)))
	}
	e.rep.add(benchRow{section: secBenchSessions, workload: e.sessionsWorkload(n), system: benchSystemLabel(sys),
		lat: e.rep.latVals(key, res.lat), rate: res.rate(), unit: "reads/s", other: other})
	e.logf("sessions %s %d: read p50 %s p99 %s (%s reads/s)", sys, n, fmtMS(res.lat.p50), fmtMS(res.lat.p99), fmtCount(res.rate()))
}

// populateSessions runs sessions [from, to) through e.sz.turns turns each:
// POST, then the submission's long poll until it settles.
func (e *benchEnv) populateSessions(ctx context.Context, client *http.Client, addr string, from, to int) (int, error) {
	var next atomic.Int64
	next.Store(int64(from))
	var turns atomic.Int64
	var wg sync.WaitGroup
	var first atomic.Value
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for range e.sz.sessionWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				s := int(next.Add(1)) - 1
				if s >= to {
					return
				}
				session := fmt.Sprintf("s-%d", s)
				for t := range e.sz.turns {
					body := []byte(fmt.Sprintf(`{"message":{"kind":"user","body":"session %d turn %d says hello"},"session":%q}`, s, t, session))
					if err := benchTurn(ctx, client, addr, body); err != nil {
						first.CompareAndSwap(nil, fmt.Errorf("%s turn %d: %w", session, t, err))
						cancel()
						return
					}
					turns.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		return int(turns.Load()), err
	}
	return int(turns.Load()), ctx.Err()
}

// benchTurn delivers body and waits for its submission to settle.
func benchTurn(ctx context.Context, client *http.Client, addr string, body []byte) error {
	st, b, err := benchPost(ctx, client, benchDeliverURL(addr), body)
	if err != nil {
		return err
	}
	if err := benchWantStatus(st, http.StatusAccepted, b); err != nil {
		return err
	}
	var acc struct {
		SubmissionID string `json:"submissionId"`
	}
	if err := json.Unmarshal(b, &acc); err != nil {
		return err
	}
	u := benchDeliverURL(addr) + "/submissions/" + url.PathEscape(acc.SubmissionID) + "?wait=30s"
	for range 10 {
		st, b, err := benchGet(ctx, client, u)
		if err != nil {
			return err
		}
		if err := benchWantStatus(st, http.StatusOK, b); err != nil {
			return err
		}
		var sub struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal(b, &sub); err != nil {
			return err
		}
		switch sub.Status {
		case "completed":
			return nil
		case "failed", "aborted":
			return fmt.Errorf("submission %s", sub.Status)
		}
	}
	return errors.New("submission not settled after 10 long polls")
}

// benchSessionRows are a session's records as the baselines store them: per
// turn, the user message row and the reply row (assistant message and
// settlement), as convlog's echo writes them.
func benchSessionRows(turns int) [][]byte {
	now := time.Now().UTC()
	var rows [][]byte
	for t := range turns {
		text := fmt.Sprintf("session turn %d says hello", t)
		p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
		sub := "sub_" + benchULID()
		user, _ := json.Marshal([]record.Record{record.EntryRecord(record.Entry{ID: benchULID(), Timestamp: now, Type: record.EntryUserMessage, SubmissionID: sub, Payload: p})})
		settle, _ := json.Marshal(map[string]string{"submissionId": sub, "outcome": "completed"})
		turnID := "turn_" + benchULID()
		reply, _ := json.Marshal([]record.Record{
			record.EntryRecord(record.Entry{ID: benchULID(), Timestamp: now, Type: record.EntryAssistantMessage, SubmissionID: sub, TurnID: turnID, Payload: p}),
			record.EntryRecord(record.Entry{ID: benchULID(), Timestamp: now, Type: record.EntrySettlement, SubmissionID: sub, TurnID: turnID, Payload: settle}),
		})
		rows = append(rows, user, reply)
	}
	return rows
}
