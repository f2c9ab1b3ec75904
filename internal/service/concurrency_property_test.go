package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/internal/config"
	"github.com/convlog/convlog/internal/servicetest"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
	"github.com/convlog/convlog/worker/remote"
)

// The concurrent model-based test: each rapid iteration draws batches of
// operations (deliveries to agents of every busy policy, aborts, rewinds,
// regenerations, forks, resets, deletes) that run at once, each on its own
// goroutine over real HTTP, against one service. After each batch it waits
// for quiescence (every admitted submission terminal) and checks the
// invariants against fresh reads (checkConcurrent). A poller per
// submission checks, the moment it first sees `completed`, that the reply
// and the settlement are readable in the stream (issue 21: the status ran
// ahead of the stream served by the tail cache, which a follower keeps
// warm; every conversation here has one).

const concAgents = `agents:
  - {name: joiner, kind: echo, busy: join}
  - {name: queuer, kind: echo, busy: queue}
  - {name: rejecter, kind: echo, busy: reject}
  - {name: interrupter, kind: echo, busy: interrupt}
`

var concAgentNames = []string{"joiner", "queuer", "rejecter", "interrupter"}

var (
	checksOnce  sync.Once
	checksGiven bool
)

// concChecks sets -rapid.checks for one test unless the command line set
// it: n by default, fewer with -short, CONVLOG_PROP_CHECKS to run more.
func concChecks(t *testing.T, n int) {
	t.Helper()
	// Asked once, before any test sets it: flag.Visit counts flag.Set too.
	checksOnce.Do(func() {
		flag.Visit(func(f *flag.Flag) { checksGiven = checksGiven || f.Name == "rapid.checks" })
	})
	if checksGiven {
		return
	}
	if testing.Short() {
		n = max(2, n/4)
	}
	if v := os.Getenv("CONVLOG_PROP_CHECKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("CONVLOG_PROP_CHECKS=%q: %v", v, err)
		}
	}
	old := flag.Lookup("rapid.checks").Value.String()
	if err := flag.Set("rapid.checks", strconv.Itoa(n)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set("rapid.checks", old) })
}

// TestConcurrentLifecycleProperty runs the model with the workers in the
// service's process: the admission fast path (a lingering runner starts
// the delivery in the admission's own commit) is on.
func TestConcurrentLifecycleProperty(t *testing.T) {
	concChecks(t, 20)
	svc, _ := testService(t, withConfig(t, concAgents))
	runConcurrentModel(t, "http://"+svc.Addr(), "l")
}

// TestConcurrentLifecycleRemoteWorkers runs it with `serve --workers=0`
// and the turns in a remote worker (its own NATS connection, the log
// through the owner): no fast path, aborts and lifecycle changes over NATS.
func TestConcurrentLifecycleRemoteWorkers(t *testing.T) {
	concChecks(t, 12)
	natsAddr := freeLoopback(t)
	svc, _ := testService(t, func(c *Config) {
		withConfig(t, concAgents)(c)
		c.NoWorkers = true
		c.NATSListen = natsAddr
	})
	startRemoteWorker(t, "nats://"+natsAddr, concAgents)
	runConcurrentModel(t, "http://"+svc.Addr(), "r")
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// concHTTP is the test's HTTP client: its own transport, so that its idle
// connections close with the test (goleak).
func concHTTP(t testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

type cclient struct {
	base string
	hc   *http.Client
}

func (c cclient) do(ctx context.Context, method, path, body string) (int, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: read: %w", method, path, err)
	}
	return resp.StatusCode, b, nil
}

func errorCode(b []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Error.Code
}

type ckey struct{ agent, instance, session string }

func (k ckey) String() string { return k.agent + "/" + k.instance + "/" + k.session }
func (k ckey) path() string   { return "/agents/" + k.agent + "/" + k.instance }
func (k ckey) q() string      { return "?session=" + url.QueryEscape(k.session) }

// csub is an admitted submission, and when its admission was asked for.
type csub struct {
	key    ckey
	id     string
	offset record.Offset
	asked  time.Time
}

// cchange is a reset of a key or a delete of an instance, and when it
// answered: it may remove the records of a submission asked for before.
type cchange struct {
	key      ckey // session "" for a delete: every session of the instance
	answered time.Time
}

// cstate is what the goroutines of a batch share.
type cstate struct {
	c cclient

	// crash: the service is killed mid-batch, so a request may find no
	// one to answer it (lost): not a violation.
	crash bool

	mu         sync.Mutex
	subs       []*csub
	changes    []cchange
	violations []string
	pollers    sync.WaitGroup
}

func (s *cstate) violate(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// lost reports a request that got no answer.
func (s *cstate) lost(err error, what string, k ckey) {
	if !s.crash {
		s.violate("%s %s: %v", what, k, err)
	}
}

func (s *cstate) admitted(sub *csub) {
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	s.pollers.Add(1)
	go func() { defer s.pollers.Done(); s.poll(sub) }()
}

func (s *cstate) changed(k ckey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changes = append(s.changes, cchange{k, time.Now()})
}

func (s *cstate) status(ctx context.Context, sub *csub, wait string) (record.Submission, error) {
	p := sub.key.path() + "/submissions/" + sub.id
	if wait != "" {
		p += "?wait=" + wait
	}
	code, b, err := s.c.do(ctx, "GET", p, "")
	if err != nil {
		return record.Submission{}, &lostError{err}
	}
	if code != 200 {
		return record.Submission{}, fmt.Errorf("status of %s: %d %s", sub.id, code, b)
	}
	var st record.Submission
	if err := json.Unmarshal(b, &st); err != nil {
		return record.Submission{}, fmt.Errorf("status of %s: %w in %s", sub.id, err, b)
	}
	return st, nil
}

// lostError is a request that got no answer.
type lostError struct{ err error }

func (e *lostError) Error() string { return e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

// poll polls the submission until it is terminal: at first without a
// wait, as fast as it can, so that it sees the status the moment the log
// commits it; then with long polls. On the first `completed` it reads the
// stream at once.
func (s *cstate) poll(sub *csub) {
	ctx := context.Background()
	fast := time.Now().Add(3 * time.Second)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		wait := ""
		if time.Now().After(fast) {
			wait = "1s"
		}
		st, err := s.status(ctx, sub, wait)
		var lost *lostError
		if s.crash && errors.As(err, &lost) {
			time.Sleep(20 * time.Millisecond) // the service is down: until it is back
			continue
		}
		if err != nil {
			s.violate("%s %s: %v", sub.key, sub.id, err)
			return
		}
		if !st.Status.Terminal() {
			continue
		}
		if st.Status == record.StatusCompleted {
			s.readable(ctx, sub, st)
		}
		return
	}
	s.violate("%s %s: not terminal within 60s", sub.key, sub.id)
}

// readable reads the submission's stream from its offset, right after its
// status said completed: unless a reset gave the stream a new incarnation
// since, its reply and its settlement must be there.
func (s *cstate) readable(ctx context.Context, sub *csub, st record.Submission) {
	off := sub.offset
	var recs []record.Record
	var inc record.Incarnation
	for first := true; ; first = false {
		code, b, err := s.c.do(ctx, "GET", sub.key.path()+"/conversation"+sub.key.q()+"&offset="+string(off), "")
		if err != nil {
			s.lost(err, "read after completed "+sub.id, sub.key)
			return
		}
		if code == 400 && errorCode(b) == "unknown_offset" {
			return // reset since: the incarnation it was admitted to is gone
		}
		if code != 200 {
			s.violate("%s %s: read after completed: %d %s", sub.key, sub.id, code, b)
			return
		}
		var p page
		if err := json.Unmarshal(b, &p); err != nil {
			s.violate("%s: %v in %s", sub.key, err, b)
			return
		}
		if !first && p.Incarnation != inc {
			return // reset while we read
		}
		inc = p.Incarnation
		for _, bt := range p.Batches {
			rs, err := bt.Records.Decode()
			if err != nil {
				s.violate("%s: %v", sub.key, err)
				return
			}
			recs = append(recs, rs...)
		}
		off = p.NextOffset
		if p.UpToDate {
			break
		}
	}
	if len(recs) == 0 || recs[0].Kind != record.KindEntry || recs[0].Entry.Type != record.EntryUserMessage || recs[0].Entry.SubmissionID != sub.id {
		return // another incarnation (a reset, or a delete and a new generation) has this offset now
	}
	settled, replied := false, false
	for _, r := range recs {
		if r.Kind != record.KindEntry {
			continue
		}
		switch r.Entry.Type {
		case record.EntrySettlement:
			if settlementOf(r).SubmissionID == sub.id {
				settled = true
			}
		case record.EntryAssistantMessage:
			replied = replied || r.Entry.TurnID == st.TurnID
		}
	}
	readChecks.Add(1)
	if !settled || !replied {
		s.violate("%s %s is completed (turn %s), but a read of its stream (%s from %s, to %s) right after has settlement %v, reply %v",
			sub.key, sub.id, st.TurnID, inc, sub.offset, off, settled, replied)
	}
}

// readChecks counts the reads made on a first `completed`, for the log.
var readChecks atomic.Int64

func settlementOf(r record.Record) record.Settlement {
	var st record.Settlement
	_ = json.Unmarshal(r.Entry.Payload, &st)
	return st
}

// histReader follows one conversation over SSE for the whole test and
// keeps every record it saw, by incarnation. After an `ended` (a delete) it
// connects again from "0": the instance may be created anew.
type histReader struct {
	key ckey

	mu       sync.Mutex
	inc      record.Incarnation
	lastID   string
	cur      []record.Record                        // of inc
	seen     map[record.Incarnation][]record.Record // every incarnation, as far as seen
	failures []string
	done     chan struct{}
}

func followHist(t *testing.T, c cclient, k ckey) *histReader {
	ctx, cancel := context.WithCancel(context.Background())
	h := &histReader{key: k, seen: map[record.Incarnation][]record.Record{}, done: make(chan struct{})}
	connected := make(chan error, 1)
	go func() {
		defer close(h.done)
		for first := true; ; first = false {
			ended, err := h.session(ctx, c, first, connected)
			if ctx.Err() != nil {
				return
			}
			if !ended {
				h.fail("stream closed: %v", err)
				return
			}
		}
	}()
	if err := <-connected; err != nil {
		cancel()
		<-h.done
		t.Fatalf("follow %s: %v", k, err)
	}
	t.Cleanup(func() { cancel(); <-h.done })
	return h
}

func (h *histReader) fail(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures = append(h.failures, fmt.Sprintf(format, args...))
}

// session reads one connection of the stream until it ends.
func (h *histReader) session(ctx context.Context, c cclient, first bool, connected chan<- error) (ended bool, _ error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+h.key.path()+"/stream"+h.key.q()+"&offset=0", nil)
	if err != nil {
		return false, err
	}
	resp, err := c.hc.Do(req)
	if err == nil && resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		err = fmt.Errorf("stream: %d %s", resp.StatusCode, b)
	}
	if first {
		connected <- err
	}
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	h.mu.Lock()
	h.inc, h.lastID, h.cur = "", "", nil
	h.mu.Unlock()
	fresh := true // the first records of a connection replace what an earlier one saw
	ended = false
	err = scanSSE(resp.Body, func(id string, data []byte) bool {
		ended = h.frame(id, data, &fresh)
		return ended
	})
	return ended, err
}

func (h *histReader) frame(id string, data []byte, fresh *bool) (ended bool) {
	var f struct {
		Type        string             `json:"type"`
		Incarnation record.Incarnation `json:"incarnation"`
		Records     []record.Record    `json:"records"`
		Code        string             `json:"code"`
		Message     string             `json:"message"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		h.fail("frame %s: %v", data, err)
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch f.Type {
	case "conversation":
		if *fresh || f.Incarnation != h.inc {
			h.seen[f.Incarnation] = nil
			*fresh = false
		}
		h.inc = f.Incarnation
		h.cur = append(h.cur, f.Records...)
		h.seen[f.Incarnation] = append(h.seen[f.Incarnation], f.Records...)
	case "reset":
		h.inc, h.cur = f.Incarnation, nil
		if _, ok := h.seen[f.Incarnation]; !ok {
			h.seen[f.Incarnation] = nil
		}
		*fresh = false
	case "ended":
		return true
	case "error":
		h.failures = append(h.failures, fmt.Sprintf("error frame %s %s", f.Code, f.Message))
	}
	if id != "" {
		h.lastID = id
	}
	return false
}

// freshRead reads a conversation whole from "0", in one incarnation.
func freshRead(ctx context.Context, c cclient, k ckey) (page, []record.Record, error) {
	{
		off := record.Start
		var recs []record.Record
		var inc record.Incarnation
		for {
			code, b, err := c.do(ctx, "GET", k.path()+"/conversation"+k.q()+"&offset="+string(off), "")
			if err != nil {
				return page{}, nil, err
			}
			if code != 200 {
				return page{}, nil, fmt.Errorf("read %s: %d %s", k, code, b)
			}
			var p page
			if err := json.Unmarshal(b, &p); err != nil {
				return page{}, nil, fmt.Errorf("read %s: %w", k, err)
			}
			if off != record.Start && p.Incarnation != inc {
				return page{}, nil, fmt.Errorf("read %s: the incarnation changed at quiescence (%s, then %s)", k, inc, p.Incarnation)
			}
			inc = p.Incarnation
			for _, bt := range p.Batches {
				rs, err := bt.Records.Decode()
				if err != nil {
					return page{}, nil, err
				}
				recs = append(recs, rs...)
			}
			off = p.NextOffset
			if p.UpToDate {
				return p, recs, nil
			}
		}
	}
}

// runConcurrentModel is the property; prefix keeps its instances apart
// from another variant's.
func runConcurrentModel(t *testing.T, base, prefix string) {
	c := cclient{base, concHTTP(t)}
	readers := map[ckey]*histReader{}
	reader := func(k ckey) *histReader {
		if readers[k] == nil {
			readers[k] = followHist(t, c, k)
		}
		return readers[k]
	}
	run := 0
	admitted, checked := 0, readChecks.Load()
	defer func() {
		t.Logf("%d submissions in passing iterations; %d reads on a first completed", admitted, readChecks.Load()-checked)
	}()
	rapid.Check(t, func(rt *rapid.T) {
		run++
		st := &cstate{c: c}
		instances := []string{fmt.Sprintf("%s%d-a", prefix, run), fmt.Sprintf("%s%d-b", prefix, run)}
		var keys []ckey
		for _, a := range concAgentNames {
			for _, i := range instances {
				for _, s := range []string{"default", "s1"} {
					keys = append(keys, ckey{a, i, s})
				}
			}
		}
		forks := 0
		batches := rapid.IntRange(1, 4).Draw(rt, "batches")
		for b := range batches {
			n := rapid.IntRange(2, 10).Draw(rt, "ops")
			var ops []func()
			var targets []ckey
			for range n {
				op, target := drawOp(rt, st, keys, &forks, prefix, run)
				ops = append(ops, op)
				if target != (ckey{}) {
					targets = append(targets, target)
				}
			}
			// Every conversation the batch may touch is followed before it runs.
			for _, k := range append(append([]ckey(nil), keys...), targets...) {
				reader(k)
			}
			var wg sync.WaitGroup
			for _, op := range ops {
				wg.Add(1)
				go func() { defer wg.Done(); op() }()
			}
			wg.Wait()
			st.pollers.Wait()
			keys = append(keys, targets...)
			checkConcurrent(rt, st, readers, keys, b)
		}
		admitted += len(st.subs) // the pollers are done
	})
}

// drawOp draws one operation; it runs later, beside the others of its
// batch, and reports what it finds wrong to st. A fork names the
// conversation it would create.
func drawOp(rt *rapid.T, st *cstate, keys []ckey, forks *int, prefix string, run int) (func(), ckey) {
	ctx := context.Background()
	k := rapid.SampledFrom(keys).Draw(rt, "key")
	pick := rapid.IntRange(0, 1<<20).Draw(rt, "pick") // which checkpoint or submission, modulo what there is
	c := st.c
	unexpected := func(what string, code int, b []byte, ok ...string) {
		if slicesContains(ok, errorCode(b)) {
			return
		}
		st.violate("%s %s: %d %s", what, k, code, b)
	}
	checkpoints := func() []checkpoint {
		code, b, err := c.do(ctx, "GET", k.path()+"/checkpoints"+k.q(), "")
		if err != nil {
			st.lost(err, "checkpoints", k)
			return nil
		}
		if code != 200 {
			st.violate("checkpoints %s: %d %s %v", k, code, b, err)
			return nil
		}
		var out struct {
			Checkpoints []checkpoint `json:"checkpoints"`
		}
		_ = json.Unmarshal(b, &out)
		return out.Checkpoints
	}
	deliver := func(path, body string, want int, what string) {
		asked := time.Now()
		code, b, err := c.do(ctx, "POST", path, body)
		if err != nil {
			st.lost(err, what, k)
			return
		}
		if code != want {
			unexpected(what, code, b, "session_busy", "mutation_in_progress", "cannot_rewind", "not_found")
			return
		}
		var acc accepted
		if err := json.Unmarshal(b, &acc); err != nil || acc.SubmissionID == "" {
			st.violate("%s %s: %v in %s", what, k, err, b)
			return
		}
		st.admitted(&csub{key: k, id: acc.SubmissionID, offset: acc.Offset, asked: asked})
	}
	switch kind := rapid.IntRange(0, 99).Draw(rt, "kind"); {
	case kind < 45:
		text := rapid.StringMatching(`[a-z]{1,6}( [a-z]{1,6}){0,2}`).Draw(rt, "text")
		if rapid.Bool().Draw(rt, "slow") {
			text = fmt.Sprintf("/sleep %dms\n", rapid.IntRange(1, 60).Draw(rt, "sleep")) + text
		}
		body, _ := json.Marshal(map[string]string{"message": text, "session": k.session})
		return func() { deliver(k.path(), string(body), 202, "deliver") }, ckey{}
	case kind < 57:
		return func() {
			// The newest unsettled-looking submission of the key, or any.
			st.mu.Lock()
			var ids []string
			for _, s := range st.subs {
				if s.key == k {
					ids = append(ids, s.id)
				}
			}
			st.mu.Unlock()
			if len(ids) == 0 {
				return
			}
			id := ids[pick%len(ids)]
			code, b, err := c.do(ctx, "POST", k.path()+"/submissions/"+id+"/abort", "")
			if err != nil {
				st.lost(err, "abort", k)
				return
			}
			if code == 200 {
				var s record.Submission
				if json.Unmarshal(b, &s) != nil || s.Status != record.StatusAborted {
					st.violate("abort %s %s: 200 but %s", k, id, b)
				}
				return
			}
			unexpected("abort "+id, code, b, "already_settled")
		}, ckey{}
	case kind < 67:
		return func() {
			cps := checkpoints()
			if len(cps) == 0 {
				return
			}
			body := `{"entryId":"` + cps[pick%len(cps)].EntryID + `","session":"` + k.session + `"}`
			code, b, err := c.do(ctx, "POST", k.path()+"/rewind", body)
			if err != nil {
				st.lost(err, "rewind", k)
			} else if code != 200 {
				unexpected("rewind", code, b, "mutation_in_progress", "cannot_rewind", "not_found")
			}
		}, ckey{}
	case kind < 77:
		last := rapid.Bool().Draw(rt, "last")
		return func() {
			body := `{"session":"` + k.session + `"}`
			if !last {
				cps := checkpoints()
				if len(cps) == 0 {
					return
				}
				body = `{"entryId":"` + cps[pick%len(cps)].EntryID + `","session":"` + k.session + `"}`
			}
			deliver(k.path()+"/regenerate", body, 202, "regenerate")
		}, ckey{}
	case kind < 85:
		*forks++
		target := ckey{k.agent, k.instance, fmt.Sprintf("fork%d", *forks)}
		body := func(entry string) string { return `{"entryId":"` + entry + `","session":"` + target.session + `"}` }
		if rapid.Bool().Draw(rt, "newInstance") {
			target = ckey{k.agent, fmt.Sprintf("%s%d-f%d", prefix, run, *forks), "default"}
			body = func(entry string) string { return `{"entryId":"` + entry + `","instanceId":"` + target.instance + `"}` }
		}
		return func() {
			cps := checkpoints()
			if len(cps) == 0 {
				return
			}
			code, b, err := c.do(ctx, "POST", k.path()+"/fork"+k.q(), body(cps[pick%len(cps)].EntryID))
			if err != nil {
				st.lost(err, "fork", k)
			} else if code != 201 {
				unexpected("fork", code, b, "mutation_in_progress", "cannot_rewind", "not_found", "conflict")
			}
		}, target
	case kind < 93:
		return func() {
			code, b, err := c.do(ctx, "POST", k.path()+"/reset", `{"session":"`+k.session+`"}`)
			st.changed(k)
			if err != nil {
				st.lost(err, "reset", k)
			} else if code != 200 {
				unexpected("reset", code, b, "mutation_in_progress", "not_found")
			}
		}, ckey{}
	default:
		return func() {
			code, b, err := c.do(ctx, "DELETE", k.path(), "")
			st.changed(ckey{k.agent, k.instance, ""})
			if err != nil {
				st.lost(err, "delete", k)
			} else if code != 200 {
				unexpected("delete", code, b, "mutation_in_progress", "not_found")
			}
		}, ckey{}
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// checkConcurrent checks the invariants at a quiescent point.
func checkConcurrent(rt *rapid.T, st *cstate, readers map[ckey]*histReader, keys []ckey, batch int) {
	ctx := context.Background()
	st.mu.Lock()
	violations := append([]string(nil), st.violations...)
	st.mu.Unlock()
	if len(violations) > 0 {
		rt.Fatalf("batch %d:\n%s", batch, strings.Join(violations, "\n"))
	}
	fresh := map[ckey][]record.Record{}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, k := range keys {
		p, recs, err := freshRead(ctx, st.c, k)
		if err != nil {
			rt.Fatal(err)
		}
		fresh[k] = recs
		// A reader connected throughout ends equal to a fresh read.
		h := readers[k]
		next := string(p.NextOffset)
		caught := func() bool {
			h.mu.Lock()
			defer h.mu.Unlock()
			last := h.lastID
			if last == "" {
				last = string(record.Start)
			}
			return h.inc == p.Incarnation && last == next
		}
		check.For(rt, 30*time.Second, 5*time.Millisecond, func() error {
			if caught() {
				return nil
			}
			h.mu.Lock()
			failed := append([]string(nil), h.failures...)
			h.mu.Unlock()
			err := fmt.Errorf("batch %d: the reader of %s never caught up with a fresh read (%s at %s); failures %q", batch, k, p.Incarnation, next, failed)
			if len(failed) > 0 {
				rt.Fatal(err) // a failed reader does not catch up by waiting
			}
			return err
		})
		h.mu.Lock()
		got, _ := json.Marshal(h.cur)
		failed := h.failures
		h.mu.Unlock()
		want, _ := json.Marshal(recs)
		if len(recs) == 0 {
			want = []byte("null")
		}
		if len(failed) > 0 {
			rt.Fatalf("batch %d: reader of %s: %q", batch, k, failed)
		}
		if !bytes.Equal(got, want) {
			rt.Fatalf("batch %d: the reader of %s holds\n%s\na fresh read\n%s", batch, k, got, want)
		}
	}
	st.mu.Lock()
	subs := append([]*csub(nil), st.subs...)
	changes := append([]cchange(nil), st.changes...)
	st.mu.Unlock()
	for _, sub := range subs {
		s, err := st.status(ctx, sub, "")
		if err != nil {
			rt.Fatal(err)
		}
		if !s.Status.Terminal() {
			rt.Fatalf("batch %d: %s %s is %s at quiescence", batch, sub.key, sub.id, s.Status)
		}
		// Its settlements in the stream of its conversation now, and in
		// every incarnation its reader saw.
		count := func(recs []record.Record) (user bool, settled []record.Settlement) {
			for _, r := range recs {
				if r.Kind != record.KindEntry {
					continue
				}
				if r.Entry.Type == record.EntryUserMessage && r.Entry.SubmissionID == sub.id {
					user = true
				}
				if r.Entry.Type == record.EntrySettlement {
					if x := settlementOf(r); x.SubmissionID == sub.id {
						settled = append(settled, x)
					}
				}
			}
			return user, settled
		}
		user, now := count(fresh[sub.key])
		h := readers[sub.key]
		h.mu.Lock()
		var ever []record.Settlement
		for inc, recs := range h.seen {
			_, in := count(recs)
			if len(in) > 1 {
				h.mu.Unlock()
				rt.Fatalf("batch %d: %s %s settled %d times in incarnation %s", batch, sub.key, sub.id, len(in), inc)
			}
			ever = append(ever, in...)
		}
		h.mu.Unlock()
		if len(ever) > 1 {
			rt.Fatalf("batch %d: %s %s settled in %d incarnations: %+v", batch, sub.key, sub.id, len(ever), ever)
		}
		removed := false // a reset or delete that answered after it was asked for may have taken its records
		for _, ch := range changes {
			if ch.answered.After(sub.asked) && ch.key.agent == sub.key.agent && ch.key.instance == sub.key.instance && (ch.key.session == "" || ch.key.session == sub.key.session) {
				removed = true
			}
		}
		var settlement *record.Settlement
		switch {
		case len(now) > 1:
			rt.Fatalf("batch %d: %s %s settled %d times: %+v", batch, sub.key, sub.id, len(now), now)
		case user && len(now) == 0:
			rt.Fatalf("batch %d: %s %s is %s, its stream holds its message and no settlement", batch, sub.key, sub.id, s.Status)
		case len(now) == 1:
			settlement = &now[0]
			if !user && (s.Error == nil || s.Error.Code != "stream_reset") {
				rt.Fatalf("batch %d: %s %s settled (%+v) in an incarnation it was not admitted to, not by a reset", batch, sub.key, sub.id, now[0])
			}
		case len(ever) == 1:
			settlement = &ever[0]
		}
		if settlement == nil {
			if !removed {
				rt.Fatalf("batch %d: %s %s is %s, and no stream holds its settlement though no reset or delete took its records", batch, sub.key, sub.id, s.Status)
			}
			continue
		}
		if string(settlement.Outcome) != string(s.Status) || settlement.AnsweredBySubmissionID != s.AnsweredBySubmissionID || (settlement.Error == nil) != (s.Error == nil) ||
			(s.Error != nil && settlement.Error.Code != s.Error.Code) {
			rt.Fatalf("batch %d: %s %s: status %s %+v answeredBy %q, settlement %+v", batch, sub.key, sub.id, s.Status, s.Error, s.AnsweredBySubmissionID, *settlement)
		}
	}
}

// startRemoteWorker runs a `convlog worker` in this process, as
// workerCommand wires it: its own NATS connection to the service's
// embedded broker, the log through the service (remote.Client), its agents
// from yaml; it stops, draining its turns, with the test.
func startRemoteWorker(t *testing.T, natsURL, yaml string) {
	t.Helper()
	f, err := config.Parse("convlog.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	logger := quietLogger()
	nc, err := natsbus.ConnectWith(natsURL, natsbus.Credentials{}, true, logger)
	if err != nil {
		t.Fatal(err)
	}
	bus, err := natsbus.NewDeltaPublisher(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	lg, err := remote.NewClient(remote.ClientConfig{NATS: nc, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	agents := pool.NewRegistry()
	if err := RegisterAgents(f, nil, 0, agents, lg, logger); err != nil {
		t.Fatal(err)
	}
	p, err := pool.NewPool(pool.Config{
		Log: lg, NATS: nc, Agents: agents, Deltas: bus, Logger: logger,
		ShutdownTimeout: 2 * time.Second, SweepInterval: time.Second, Remote: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	abortCtx, stopAborts := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := remote.ServeAborts(abortCtx, nc, "", p); err != nil && abortCtx.Err() == nil {
			t.Errorf("worker aborts: %v", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := p.Run(ctx); err != nil {
			t.Errorf("worker: %v", err)
		}
		stopAborts()
	}()
	// Registered after testService's: runs before the service stops.
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = bus.Close()
		nc.Close()
	})
}

// childEnv names, for the child process of TestConcurrentKill9Restart, the
// data folder and the address to serve.
const childEnv = "CONVLOG_PROP_CHILD"

// TestConcurrentChildService is the service as a child process of
// TestConcurrentKill9Restart (this test binary run again, as `convlog
// serve` would run it): it serves until it is killed. Run by itself it
// has nothing to do.
func TestConcurrentChildService(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	data, addr, _ := strings.Cut(spec, "|")
	f, err := config.Parse("convlog.yaml", []byte(concAgents))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(Config{Listen: addr, Data: data, Heartbeat: time.Second, ShutdownTimeout: 2 * time.Second, Agents: f, Logger: quietLogger()}); err != nil {
		t.Fatal(err)
	}
	select {} // until SIGKILL
}

// child is a running service child process. kill is safe to call twice
// and after the child exited: exited is closed, not sent on.
type child struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error // cmd.Wait's, once exited is closed
}

func startChild(t *testing.T, data, addr string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestConcurrentChildService$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+data+"|"+addr)
	var stderr servicetest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	go func() { c.waitErr = cmd.Wait(); close(c.exited) }()
	// A child that never became ready is killed as the test fails.
	ready := false
	defer func() {
		if !ready {
			c.kill()
		}
	}()
	check.For(t, 60*time.Second, 20*time.Millisecond, func() error {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-c.exited:
			t.Fatalf("the service exited: %v\n%s", c.waitErr, stderr.String())
		default:
		}
		return fmt.Errorf("the service never became ready:\n%s", stderr.String())
	})
	ready = true
	return c
}

func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// TestConcurrentKill9Restart runs a batch of the model against the service
// in a child process, kills it with SIGKILL at a random moment of the
// batch, starts it again on the same data folder and checks the invariants
// once every submission is terminal: a turn the kill cut short is settled
// interrupted by the next process; readers connect again after the
// restart (none can stay connected through a kill).
func TestConcurrentKill9Restart(t *testing.T) {
	concChecks(t, 6)
	data, addr := t.TempDir(), freeLoopback(t)
	proc := startChild(t, data, addr)
	t.Cleanup(func() { proc.kill() })
	c := cclient{"http://" + addr, concHTTP(t)}
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		st := &cstate{c: c, crash: true}
		var keys []ckey
		for _, a := range concAgentNames {
			for _, s := range []string{"default", "s1"} {
				keys = append(keys, ckey{a, fmt.Sprintf("k%d", run), s})
			}
		}
		forks := 0
		var ops []func()
		for range rapid.IntRange(4, 12).Draw(rt, "ops") {
			op, target := drawOp(rt, st, keys, &forks, "k", run)
			ops = append(ops, op)
			if target != (ckey{}) {
				keys = append(keys, target)
			}
		}
		after := time.Duration(rapid.IntRange(0, 80).Draw(rt, "killAfterMs")) * time.Millisecond
		var wg sync.WaitGroup
		for _, op := range ops {
			wg.Add(1)
			go func() { defer wg.Done(); op() }()
		}
		time.Sleep(after) // the moment of the kill is the draw's, not a wait for a condition
		proc.kill()
		wg.Wait()
		proc = startChild(t, data, addr)
		st.pollers.Wait()
		st.crash = false // what follows must be answered
		readers := map[ckey]*histReader{}
		for _, k := range keys {
			readers[k] = followHist(t, c, k)
		}
		checkConcurrent(rt, st, readers, keys, 0)
		outcomes := map[string]int{}
		for _, sub := range st.subs {
			s, _ := st.status(context.Background(), sub, "")
			code := ""
			if s.Error != nil {
				code = " " + s.Error.Code
			}
			outcomes[string(s.Status)+code]++
		}
		rt.Logf("killed after %v, pid %d now: %v", after, proc.cmd.Process.Pid, outcomes)
	})
}
