package log_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// The crash test re-executes the test binary as a child that writes to a log
// as fast as it can and reports every acknowledged write on stdout; the
// parent kills it with SIGKILL at a random moment, reopens the log and checks
// that everything acknowledged survived, whole and in order, and that nothing
// half-written is visible.
//
// Environment:
//
//	CONVLOG_CRASH_CHILD   the child's log file (set by the parent only)
//	CONVLOG_CRASH_SEED    the parent's random seed: it fixes the kill times
//	                      and the parent's probes; the child's interleaving
//	                      is the scheduler's
//	CONVLOG_CRASH_CYCLES  the number of kill cycles (default 50, 10 in -short)
const (
	crashChildEnv  = "CONVLOG_CRASH_CHILD"
	crashSeedEnv   = "CONVLOG_CRASH_SEED"
	crashCyclesEnv = "CONVLOG_CRASH_CYCLES"

	crashAckPrefix    = "ACK "
	crashIntentPrefix = "INTENT "
	crashFailPrefix   = "FAIL "

	crashWriters  = 8
	crashChildTTL = 60 * time.Second // a child the parent lost exits by itself
)

// crashKeys are the streams the child writes to.
var crashKeys = []record.Key{
	{Agent: "crash", Instance: "i1", Session: "s0"},
	{Agent: "crash", Instance: "i1", Session: "s1"},
	{Agent: "crash", Instance: "i2", Session: "s0"},
	{Agent: "crash", Instance: "i2", Session: "default"},
}

// crashAck is one acknowledged write, one line of the child's stdout.
type crashAck struct {
	Op   string   `json:"op"` // append, admit, settle, publish, parent
	Key  int      `json:"key"`
	Off  string   `json:"off,omitempty"`
	Next string   `json:"next,omitempty"` // empty for admissions: Admit does not say
	N    int      `json:"n,omitempty"`
	IDs  []string `json:"ids,omitempty"` // entry ids in order, "" for a truncation
	Sub  string   `json:"sub,omitempty"`
	Idem string   `json:"idem,omitempty"` // the admission's idempotency key
}

// crashTag is the payload of every record the test writes (the reason of a
// truncation): it lets the parent check that a batch nobody acknowledged is
// still whole.
type crashTag struct {
	T  string `json:"t"`  // unique per batch
	I  int    `json:"i"`  // index in the batch
	N  int    `json:"n"`  // tagged records in the batch
	Op string `json:"op"` // the write that made it
}

func crashTagged(tag string, n int, op string, trunc func(i int) (bool, string)) []record.Record {
	recs := make([]record.Record, n)
	for i := range recs {
		b, _ := json.Marshal(crashTag{T: tag, I: i, N: n, Op: op})
		if ok, to := trunc(i); ok {
			recs[i] = record.TruncatedRecord(to, string(b))
			continue
		}
		recs[i] = record.EntryRecord(record.Entry{Type: "crash_test", Payload: b})
	}
	return recs
}

func noTrunc(int) (bool, string) { return false, "" }

func recordIDs(recs []record.Record) []string {
	ids := make([]string, len(recs))
	for i, r := range recs {
		if r.Kind == record.KindEntry {
			ids[i] = r.Entry.ID
		}
	}
	return ids
}

// TestCrashChild is the writer that TestCrash kills; it does nothing unless
// TestCrash started it.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("helper process of TestCrash")
	}
	var outMu sync.Mutex
	emit := func(prefix string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		line := append([]byte(prefix), b...)
		line = append(line, '\n')
		outMu.Lock()
		defer outMu.Unlock()
		// One write per line, straight to the pipe: no buffering to lose.
		if _, err := os.Stdout.Write(line); err != nil {
			os.Exit(4)
		}
	}
	fail := func(format string, args ...any) {
		outMu.Lock()
		fmt.Fprintf(os.Stdout, crashFailPrefix+format+"\n", args...)
		os.Exit(2)
	}
	time.AfterFunc(crashChildTTL, func() { fail("child ran for %v without being killed", crashChildTTL) })

	db, err := clog.Open(path, &clog.Options{LockTimeout: 20 * time.Second})
	if err != nil {
		fail("open: %v", err)
	}
	ctx := context.Background()

	// lastEntry is an entry each stream is known to hold: a target for
	// truncations, which the engine resolves through its entry index.
	var lastMu sync.Mutex
	lastEntry := make([]string, len(crashKeys))
	remember := func(k int, ids []string) {
		lastMu.Lock()
		defer lastMu.Unlock()
		for _, id := range ids {
			if id != "" {
				lastEntry[k] = id
			}
		}
	}
	rewindTarget := func(k int) string {
		lastMu.Lock()
		defer lastMu.Unlock()
		return lastEntry[k]
	}

	var wg sync.WaitGroup
	for g := range crashWriters {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(g)))
			type own struct {
				id  string
				key int
			}
			var unsettled, published []own
			for n := 0; ; n++ {
				k := rng.IntN(len(crashKeys))
				key := crashKeys[k]
				tag := fmt.Sprintf("%d-%d-%d", os.Getpid(), g, n)
				op := rng.IntN(100)
				if (op >= 75 && op < 90 && len(unsettled) == 0) || (op >= 90 && len(published) == 0) {
					op = 0
				}
				switch {
				case op < 50:
					recs := crashTagged(tag, 1+rng.IntN(5), "append", func(int) (bool, string) {
						if rng.IntN(100) < 15 {
							return true, rewindTarget(k)
						}
						return false, ""
					})
					res, err := db.Append(ctx, key, recs...)
					if err != nil {
						fail("append %s: %v", key, err)
					}
					ids := recordIDs(res.Records)
					emit(crashAckPrefix, crashAck{Op: "append", Key: k, Off: string(res.Offset), Next: string(res.NextOffset), N: len(res.Records), IDs: ids})
					remember(k, ids)
				case op < 75:
					recs := crashTagged(tag, 1+rng.IntN(2), "admit", noTrunc)
					for _, rec := range recs {
						rec.Entry.ID = "e_" + ulid.Make().String()
					}
					a := clog.Admission{Key: key, Records: recs}
					if rng.IntN(2) == 0 {
						a.IdempotencyKey, a.RequestHash = "idem-"+tag, "hash-"+tag
					}
					sub, replayed, err := db.Admit(ctx, a)
					if err != nil || replayed {
						fail("admit %s: replayed %v, %v", key, replayed, err)
					}
					ids := recordIDs(recs)
					emit(crashAckPrefix, crashAck{Op: "admit", Key: k, Off: string(sub.Offset), N: len(recs), IDs: ids, Sub: sub.ID, Idem: a.IdempotencyKey})
					remember(k, ids)
					unsettled = append(unsettled, own{sub.ID, k})
					published = append(published, own{sub.ID, k})
				case op < 90:
					i := rng.IntN(len(unsettled))
					s := unsettled[i]
					unsettled = slices.Delete(unsettled, i, i+1)
					w := clog.Write{
						Key:     crashKeys[s.key],
						Records: crashTagged(tag, rng.IntN(2), "settle", noTrunc),
						Settle:  []record.Settlement{{SubmissionID: s.id, Outcome: record.OutcomeCompleted}},
					}
					res, err := db.Write(ctx, w)
					if err != nil {
						fail("settle %s on %s: %v", s.id, w.Key, err)
					}
					ids := recordIDs(res.Records)
					emit(crashAckPrefix, crashAck{Op: "settle", Key: s.key, Off: string(res.Offset), Next: string(res.NextOffset), N: len(res.Records), IDs: ids, Sub: s.id})
					remember(s.key, ids)
				default:
					i := rng.IntN(len(published))
					s := published[i]
					published = slices.Delete(published, i, i+1)
					emit(crashIntentPrefix, crashAck{Op: "publish", Key: s.key, Sub: s.id})
					if err := db.MarkPublished(ctx, s.id); err != nil {
						fail("publish %s: %v", s.id, err)
					}
					emit(crashAckPrefix, crashAck{Op: "publish", Key: s.key, Sub: s.id})
				}
			}
		})
	}
	wg.Wait() // never: the writers loop until the parent kills the process
}

// crashBatch is what the parent knows of a stored batch once it has seen it
// in a cleanly reopened log; it must never change afterwards.
type crashBatch struct {
	raw  []byte
	next record.Offset
	recs []record.Record
}

type crashState struct {
	t    *testing.T
	path string
	rng  *rand.Rand

	acks      [][]crashAck // per key: acknowledged writes with records
	admitted  map[string]crashAck
	settled   map[string]bool
	published map[string]bool // acknowledged MarkPublished
	intended  map[string]bool // MarkPublished started
	seen      []map[record.Offset]*crashBatch
	inc       []record.Incarnation
	batches   int
	ackedOff  []map[record.Offset]bool
	unacked   int // batches found that no acknowledgement reported
}

func TestCrash(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("in the child")
	}
	cycles := 50
	if testing.Short() {
		cycles = 10
	}
	if s := os.Getenv(crashCyclesEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s: %v", crashCyclesEnv, err)
		}
		cycles = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crashSeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", crashSeedEnv, err)
		}
		seed = n
	}
	t.Logf("seed %d (rerun with %s=%d); %d kill cycles", seed, crashSeedEnv, seed, cycles)

	st := &crashState{
		t:         t,
		path:      filepath.Join(t.TempDir(), "crash.db"),
		rng:       rand.New(rand.NewPCG(seed, 0x5eed)),
		acks:      make([][]crashAck, len(crashKeys)),
		admitted:  map[string]crashAck{},
		settled:   map[string]bool{},
		published: map[string]bool{},
		intended:  map[string]bool{},
		seen:      make([]map[record.Offset]*crashBatch, len(crashKeys)),
		inc:       make([]record.Incarnation, len(crashKeys)),
		ackedOff:  make([]map[record.Offset]bool, len(crashKeys)),
	}
	for i := range st.seen {
		st.seen[i] = map[record.Offset]*crashBatch{}
		st.ackedOff[i] = map[record.Offset]bool{}
	}
	start := time.Now()
	var acked int
	for c := range cycles {
		n := st.runChild(c)
		acked += n
		st.verify(c)
		if t.Failed() {
			t.Fatalf("cycle %d failed (seed %d)", c, seed)
		}
	}
	t.Logf("%d cycles in %v: %d acknowledged writes, %d batches in the log, %d of them committed but unacknowledged at the kill",
		cycles, time.Since(start).Round(time.Millisecond), acked, st.batches, st.unacked)
}

// runChild runs one child until a random moment after its first
// acknowledgement, kills it and records what it acknowledged.
func (st *crashState) runChild(cycle int) int {
	t := st.t
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+st.path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()

	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				// A partial last line is a write the kill cut short.
				if err != io.EOF {
					t.Errorf("cycle %d: reading the child: %v", cycle, err)
				}
				return
			}
			lines <- strings.TrimSuffix(line, "\n")
		}
	}()

	var got []string
	select {
	case line, ok := <-lines:
		if !ok {
			_ = cmd.Wait()
			killed = true
			t.Fatalf("cycle %d: child exited before any write: %v\nstderr:\n%s", cycle, cmd.ProcessState, stderr.String())
		}
		got = append(got, line)
	case <-time.After(30 * time.Second):
		t.Fatalf("cycle %d: no acknowledgement in 30s\nstderr:\n%s", cycle, stderr.String())
	}
	timer := time.After(time.Duration(20+st.rng.IntN(131)) * time.Millisecond)
wait:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break wait
			}
			got = append(got, line)
		case <-timer:
			break wait
		}
	}
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("cycle %d: kill: %v", cycle, err)
	}
	for line := range lines {
		got = append(got, line)
	}
	err = cmd.Wait()
	killed = true
	if ws, ok := cmd.ProcessState.Sys().(interface{ Signaled() bool }); !ok || !ws.Signaled() {
		t.Errorf("cycle %d: child was not killed but exited: %v\nstderr:\n%s", cycle, err, stderr.String())
	}

	acks := 0
	for _, line := range got {
		switch {
		case strings.HasPrefix(line, crashAckPrefix):
			var a crashAck
			if err := json.Unmarshal([]byte(line[len(crashAckPrefix):]), &a); err != nil {
				t.Fatalf("cycle %d: bad line %q: %v", cycle, line, err)
			}
			st.ack(a)
			acks++
		case strings.HasPrefix(line, crashIntentPrefix):
			var a crashAck
			if err := json.Unmarshal([]byte(line[len(crashIntentPrefix):]), &a); err != nil {
				t.Fatalf("cycle %d: bad line %q: %v", cycle, line, err)
			}
			st.intended[a.Sub] = true
		case strings.HasPrefix(line, crashFailPrefix):
			t.Fatalf("cycle %d: child: %s\nstderr:\n%s", cycle, line, stderr.String())
		}
	}
	return acks
}

func (st *crashState) ack(a crashAck) {
	switch a.Op {
	case "publish":
		st.published[a.Sub] = true
		return
	case "admit":
		st.admitted[a.Sub] = a
	case "settle":
		st.settled[a.Sub] = true
	}
	st.acks[a.Key] = append(st.acks[a.Key], a)
	st.ackedOff[a.Key][record.Offset(a.Off)] = true
}

// verify reopens the log and checks it against everything acknowledged so
// far, then appends to every stream and closes it again.
func (st *crashState) verify(cycle int) {
	t := st.t
	ctx := context.Background()
	db, err := clog.Open(st.path, &clog.Options{LockTimeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("cycle %d: reopen: %v", cycle, err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Errorf("cycle %d: close: %v", cycle, err)
		}
	}()
	errorf := func(format string, args ...any) {
		t.Helper()
		t.Errorf("cycle %d: "+format, append([]any{cycle}, args...)...)
	}

	// found: submissions whose admission batch is in a stream, in stream
	// order; settledIn: submissions with a settlement entry.
	type found struct {
		off     record.Offset
		entryID string
	}
	allFound := map[string]found{}
	st.batches = 0
	for k, key := range crashKeys {
		inc, tail, err := db.Tail(ctx, key)
		if err != nil {
			t.Fatalf("cycle %d: tail %s: %v", cycle, key, err)
		}
		if st.inc[k] != "" && inc != st.inc[k] {
			errorf("%s: incarnation %q became %q", key, st.inc[k], inc)
		}
		st.inc[k] = inc

		// Walk the stream in pages; learn each new batch's next offset with
		// a read of that batch alone (offsets are opaque).
		var stream []record.Offset
		inStream := map[record.Offset]bool{}
		offset := record.Start
		for {
			res, err := db.Read(ctx, key, offset, clog.MaxReadLimit)
			if err != nil {
				t.Fatalf("cycle %d: read %s at %s: %v", cycle, key, offset, err)
			}
			if len(res.Batches) == 0 {
				if !res.UpToDate || res.NextOffset != offset {
					errorf("%s: empty page at %s: %+v", key, offset, res)
				}
				break
			}
			if res.Incarnation != inc {
				errorf("%s: read incarnation %q, tail %q", key, res.Incarnation, inc)
			}
			for _, b := range res.Batches {
				if b.Offset != offset {
					t.Fatalf("cycle %d: %s: batch at %s, want %s: offsets do not chain", cycle, key, b.Offset, offset)
				}
				cb := st.seen[k][b.Offset]
				if cb != nil {
					if !bytes.Equal(cb.raw, b.Records) {
						errorf("%s: batch at %s changed:\nwas %s\nnow %s", key, b.Offset, cb.raw, b.Records)
					}
				} else {
					one, err := db.Read(ctx, key, b.Offset, 1)
					if err != nil {
						t.Fatalf("cycle %d: read %s at %s: %v", cycle, key, b.Offset, err)
					}
					if len(one.Batches) != 1 || !bytes.Equal(one.Batches[0].Records, b.Records) {
						t.Fatalf("cycle %d: %s at %s: limit-1 read %+v differs from %s", cycle, key, b.Offset, one, b.Records)
					}
					recs, err := b.Records.Decode()
					if err != nil {
						t.Fatalf("cycle %d: %s at %s: %v", cycle, key, b.Offset, err)
					}
					cb = &crashBatch{raw: bytes.Clone(b.Records), next: one.NextOffset, recs: recs}
					st.seen[k][b.Offset] = cb
					if !st.ackedOff[k][b.Offset] {
						st.unacked++
					}
				}
				if len(cb.recs) != b.Count {
					errorf("%s at %s: count %d, %d records", key, b.Offset, b.Count, len(cb.recs))
				}
				if err := checkWhole(cb.recs); err != nil {
					errorf("%s at %s: partial batch: %v\n%s", key, b.Offset, err, cb.raw)
				}
				stream = append(stream, b.Offset)
				inStream[b.Offset] = true
				offset = cb.next
			}
			if res.NextOffset != offset {
				errorf("%s: page ends at %s, its last batch at %s", key, res.NextOffset, offset)
			}
			if res.UpToDate {
				break
			}
		}
		if offset != tail {
			errorf("%s: the batches end at %s, the tail is %s", key, offset, tail)
		}
		st.batches += len(stream)
		for off := range st.seen[k] {
			if !inStream[off] {
				errorf("%s: the batch seen at %s is gone", key, off)
			}
		}

		// Replay the stream: unique ids, each entry's parent the leaf,
		// truncations to entries before them.
		leaf := ""
		ids := map[string]bool{}
		var admissions []string
		settledIn := map[string]bool{}
		for _, off := range stream {
			recs := st.seen[k][off].recs
			for i, r := range recs {
				switch r.Kind {
				case record.KindEntry:
					e := r.Entry
					if ids[e.ID] || e.ID == "" {
						errorf("%s at %s: entry id %q repeated", key, off, e.ID)
					}
					ids[e.ID] = true
					if e.ParentID != leaf {
						errorf("%s at %s: entry %s has parent %q, leaf is %q", key, off, e.ID, e.ParentID, leaf)
					}
					leaf = e.ID
					if e.Type == record.EntrySettlement {
						settledIn[e.SubmissionID] = true
					} else if i == 0 && e.SubmissionID != "" {
						admissions = append(admissions, e.SubmissionID)
						allFound[e.SubmissionID] = found{off, e.ID}
					}
				case record.KindTruncated:
					if r.RewoundTo != "" && !ids[r.RewoundTo] {
						errorf("%s at %s: truncation to %q, not an earlier entry", key, off, r.RewoundTo)
					}
					if r.NewLeafID != r.RewoundTo {
						errorf("%s at %s: truncation to %q has new leaf %q", key, off, r.RewoundTo, r.NewLeafID)
					}
					leaf = r.NewLeafID
				default:
					errorf("%s at %s: record kind %q", key, off, r.Kind)
				}
			}
		}

		// Every acknowledged batch is there, as acknowledged.
		for _, a := range st.acks[k] {
			cb := st.seen[k][record.Offset(a.Off)]
			if cb == nil || !inStream[record.Offset(a.Off)] {
				errorf("%s: acknowledged %s at %s is missing", key, a.Op, a.Off)
				continue
			}
			if a.Next != "" && cb.next != record.Offset(a.Next) {
				errorf("%s: acknowledged %s at %s ended at %s, the log says %s", key, a.Op, a.Off, a.Next, cb.next)
			}
			if got := recordIDs(cb.recs); len(cb.recs) != a.N || !slices.Equal(got, a.IDs) {
				errorf("%s: acknowledged %s at %s: %d records %q, the log has %q", key, a.Op, a.Off, a.N, a.IDs, got)
			}
		}

		// Submissions agree with the stream: each admission has its
		// submission, settled exactly when its settlement entry is there,
		// and the queue holds the others in admission order.
		var wantPending []string
		for _, id := range admissions {
			s, err := db.Submission(ctx, id)
			if err != nil {
				errorf("%s: admission batch at %s without its submission: %v", key, allFound[id].off, err)
				continue
			}
			if s.Key != key || s.Offset != allFound[id].off || s.EntryID != allFound[id].entryID {
				errorf("%s: submission %+v, admitted at %s with entry %s", key, s, allFound[id].off, allFound[id].entryID)
			}
			if s.Status.Terminal() != settledIn[id] {
				errorf("%s: submission %s is %s; settlement entry present: %v", key, id, s.Status, settledIn[id])
			}
			if !settledIn[id] {
				wantPending = append(wantPending, id)
			}
		}
		for id := range settledIn {
			if _, ok := allFound[id]; !ok {
				errorf("%s: settlement of %s, never admitted here", key, id)
			}
		}
		pending, err := db.Pending(ctx, key)
		if err != nil {
			t.Fatalf("cycle %d: pending %s: %v", cycle, key, err)
		}
		var gotPending []string
		for _, s := range pending {
			gotPending = append(gotPending, s.ID)
		}
		if !slices.Equal(gotPending, wantPending) {
			errorf("%s: pending %q, want %q", key, gotPending, wantPending)
		}

		// Appending goes on at the tail, after the leaf the stream ends with.
		tag := fmt.Sprintf("parent-%d-%d", cycle, k)
		res, err := db.Append(ctx, key, crashTagged(tag, 1+st.rng.IntN(3), "parent", noTrunc)...)
		if err != nil {
			t.Fatalf("cycle %d: append %s after reopen: %v", cycle, key, err)
		}
		if res.Offset != tail {
			errorf("%s: append after reopen at %s, tail was %s", key, res.Offset, tail)
		}
		if res.Records[0].Entry.ParentID != leaf {
			errorf("%s: append after reopen has parent %q, the stream's leaf is %q", key, res.Records[0].Entry.ParentID, leaf)
		}
		st.ack(crashAck{Op: "parent", Key: k, Off: string(res.Offset), Next: string(res.NextOffset), N: len(res.Records), IDs: recordIDs(res.Records)})

		// The entry index survived: an existing id is a duplicate.
		if len(ids) > 0 {
			var some string
			for id := range ids {
				some = id
				break
			}
			dup := record.EntryRecord(record.Entry{ID: some, Type: "crash_test", Payload: json.RawMessage(`{}`)})
			if _, err := db.Append(ctx, key, dup); !errors.Is(err, clog.ErrDuplicateEntry) {
				errorf("%s: appending existing id %s: %v, want ErrDuplicateEntry", key, some, err)
			}
		}
	}

	// Acknowledged admissions and settlements.
	for id, a := range st.admitted {
		f, ok := allFound[id]
		if !ok {
			errorf("acknowledged admission %s (%s at %s) is not in its stream", id, crashKeys[a.Key], a.Off)
		} else if string(f.off) != a.Off {
			errorf("acknowledged admission %s at %s, found at %s", id, a.Off, f.off)
		}
	}
	for id := range st.settled {
		s, err := db.Submission(ctx, id)
		if err != nil || s.Status != record.StatusCompleted {
			errorf("acknowledged settlement of %s: %+v %v", id, s, err)
		}
	}

	// The outbox holds every admission not marked published; an
	// acknowledged publication is gone from it.
	unpublished, err := db.Unpublished(ctx, 1<<30)
	if err != nil {
		t.Fatalf("cycle %d: unpublished: %v", cycle, err)
	}
	inOutbox := map[string]bool{}
	for _, s := range unpublished {
		if _, ok := allFound[s.ID]; !ok {
			errorf("outbox holds %s, admitted nowhere", s.ID)
		}
		if st.published[s.ID] {
			errorf("outbox holds %s, whose publication was acknowledged", s.ID)
		}
		inOutbox[s.ID] = true
	}
	for id := range allFound {
		if !inOutbox[id] && !st.intended[id] {
			errorf("submission %s left the outbox, never marked published", id)
		}
	}

	// Idempotency keys are still remembered: a few acknowledged keyed
	// admissions replay, and refuse another request.
	var keyed []crashAck
	for _, a := range st.admitted {
		if a.Idem != "" {
			keyed = append(keyed, a)
		}
	}
	slices.SortFunc(keyed, func(a, b crashAck) int { return strings.Compare(a.Sub, b.Sub) })
	for range min(3, len(keyed)) {
		a := keyed[st.rng.IntN(len(keyed))]
		adm := clog.Admission{
			Key: crashKeys[a.Key], Records: crashTagged("probe", 1, "parent", noTrunc),
			IdempotencyKey: a.Idem, RequestHash: "other",
		}
		if _, _, err := db.Admit(ctx, adm); !errors.Is(err, clog.ErrIdempotencyKeyReused) {
			errorf("admission %s with its key and another request: %v, want ErrIdempotencyKeyReused", a.Sub, err)
		}
		adm.RequestHash = "hash-" + strings.TrimPrefix(a.Idem, "idem-")
		sub, replayed, err := db.Admit(ctx, adm)
		if err != nil || !replayed || sub.ID != a.Sub || string(sub.Offset) != a.Off {
			errorf("replaying admission %s at %s: %+v replayed %v, %v", a.Sub, a.Off, sub, replayed, err)
		}
	}
}

// checkWhole checks that recs is one batch as the test writes them: tagged
// records 0..n-1 of one tag, then at most one settlement entry (exactly one
// for a settle write).
func checkWhole(recs []record.Record) error {
	if len(recs) == 0 {
		return errors.New("empty batch")
	}
	tagged := len(recs)
	if last := recs[len(recs)-1]; last.Kind == record.KindEntry && last.Entry.Type == record.EntrySettlement {
		tagged--
	}
	var first crashTag
	for i, r := range recs[:tagged] {
		var raw string
		switch {
		case r.Kind == record.KindEntry && r.Entry.Type == "crash_test":
			raw = string(r.Entry.Payload)
		case r.Kind == record.KindTruncated:
			raw = r.Reason
		default:
			return fmt.Errorf("record %d: unexpected %s record", i, r.Kind)
		}
		var tag crashTag
		if err := json.Unmarshal([]byte(raw), &tag); err != nil {
			return fmt.Errorf("record %d: tag: %v", i, err)
		}
		if i == 0 {
			first = tag
		}
		if tag.T != first.T || tag.I != i || tag.N != tagged || tag.Op != first.Op {
			return fmt.Errorf("record %d: tag %+v in a batch of %d tagged records starting %+v", i, tag, tagged, first)
		}
	}
	settle := tagged < len(recs)
	if tagged > 0 && settle != (first.Op == "settle") {
		return fmt.Errorf("%s batch with settlement entry: %v", first.Op, settle)
	}
	return nil
}
