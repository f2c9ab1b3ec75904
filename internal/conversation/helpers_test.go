package conversation_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
)

// openDB opens a real log in a temp folder, closed with the test.
func openDB(t *testing.T) *log.DB {
	t.Helper()
	db, err := log.Open(filepath.Join(t.TempDir(), "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

// agents is the test's agent table.
type agents map[string]worker.AgentOptions

func (a agents) Options(name string) (worker.AgentOptions, bool) {
	o, ok := a[name]
	return o, ok
}

func (a agents) List() []worker.AgentInfo {
	var out []worker.AgentInfo
	for n, o := range a {
		out = append(out, worker.AgentInfo{Name: n, Busy: o.Busy})
	}
	return out
}

// kicks counts the core's outbox kicks.
type kicks struct{ n atomic.Int64 }

func (k *kicks) Kick() { k.n.Add(1) }

// hookLog is the real log with hooks a test may set, each run once,
// before the call it names reaches the log: to step in between the core's
// steps.
type hookLog struct {
	*log.DB
	mu        sync.Mutex
	onPending func(key record.Key)
	onChange  func(ch log.Change)
}

func (h *hookLog) Pending(ctx context.Context, key record.Key) ([]record.Submission, error) {
	h.mu.Lock()
	f := h.onPending
	h.onPending = nil
	h.mu.Unlock()
	if f != nil {
		f(key)
	}
	return h.DB.Pending(ctx, key)
}

func (h *hookLog) Change(ctx context.Context, ch log.Change) (log.ChangeResult, bool, error) {
	h.mu.Lock()
	f := h.onChange
	h.onChange = nil
	h.mu.Unlock()
	if f != nil {
		f(ch)
	}
	return h.DB.Change(ctx, ch)
}

type quiesceCall struct {
	keys       []record.Key
	abortFirst bool
}

// fakeRunner is a Runner with no agents: turns "run" only in the log's
// state (a submission started by a claim, or by startTurn). It records
// what the core asks of it.
type fakeRunner struct {
	db *log.DB
	// offer makes Claim offer a turn.
	offer bool
	// finish, when set, is how a running turn ends when it is aborted: it
	// settled so itself before the abort reached it.
	finish record.Outcome
	// block: Quiesce of these sessions sends its keys on entered and
	// waits for release before it does anything.
	block   map[record.Key]bool
	entered chan []record.Key
	release chan struct{}

	mu       sync.Mutex
	n        int
	claims   []*fakeClaim
	aborts   []string
	quiesces []quiesceCall
}

func (r *fakeRunner) Claim(key record.Key) conversation.Claim {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.offer {
		return nil
	}
	r.n++
	c := &fakeClaim{turnID: fmt.Sprintf("turn_%d", r.n)}
	r.claims = append(r.claims, c)
	return c
}

func (r *fakeRunner) Abort(ctx context.Context, id string) (record.Submission, error) {
	r.mu.Lock()
	r.aborts = append(r.aborts, id)
	finish := r.finish
	r.mu.Unlock()
	sub, err := r.db.Submission(ctx, id)
	if err != nil {
		return sub, err
	}
	if sub.Status.Terminal() {
		return sub, fmt.Errorf("abort %s: %w", id, log.ErrSubmissionSettled)
	}
	outcome := record.OutcomeAborted
	if sub.Status == record.StatusRunning && finish != "" {
		outcome = finish
	}
	if err := settle(ctx, r.db, sub, outcome); err != nil {
		return sub, err
	}
	return r.db.Submission(ctx, id)
}

func (r *fakeRunner) Quiesce(ctx context.Context, keys []record.Key, abortFirst bool, fn func(context.Context) error) error {
	r.mu.Lock()
	r.quiesces = append(r.quiesces, quiesceCall{slices.Clone(keys), abortFirst})
	blocked := false
	for _, k := range keys {
		blocked = blocked || r.block[k]
	}
	r.mu.Unlock()
	if blocked {
		r.entered <- keys
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if abortFirst {
		// As a runner does: the running turns are cancelled and settle
		// themselves aborted before fn.
		for _, k := range keys {
			pending, err := r.db.Pending(ctx, k)
			if err != nil {
				return err
			}
			for _, p := range pending {
				if p.Status == record.StatusRunning {
					if err := settle(ctx, r.db, p, record.OutcomeAborted); err != nil {
						return err
					}
				}
			}
		}
	}
	return fn(ctx)
}

func (r *fakeRunner) abortCalls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.aborts)
}

func (r *fakeRunner) quiesceCalls() []quiesceCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.quiesces)
}

func (r *fakeRunner) claimList() []*fakeClaim {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.claims)
}

type fakeClaim struct {
	turnID string

	mu       sync.Mutex
	started  []record.Submission
	releases int
}

func (c *fakeClaim) TurnID() string { return c.turnID }

func (c *fakeClaim) Started(s record.Submission) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started = append(c.started, s)
}

func (c *fakeClaim) Release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releases++
}

func (c *fakeClaim) state() ([]record.Submission, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.started), c.releases
}

// settle settles sub with outcome, as its turn (if it runs) would.
func settle(ctx context.Context, db *log.DB, sub record.Submission, outcome record.Outcome) error {
	st := record.Settlement{SubmissionID: sub.ID, Outcome: outcome}
	if outcome != record.OutcomeCompleted {
		st.Error = &record.Failure{Code: string(outcome), Message: "test"}
	}
	_, err := db.Write(ctx, log.Write{Key: sub.Key, TurnID: sub.TurnID, Settle: []record.Settlement{st}})
	return err
}

// startTurn starts an admitted submission, as a worker would.
func startTurn(t *testing.T, db *log.DB, sub record.Submission) record.Submission {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Write(ctx, log.Write{Key: sub.Key, Start: []string{sub.ID}, TurnID: "turn_of_" + sub.ID}); err != nil {
		t.Fatal(err)
	}
	s, err := db.Submission(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type rig struct {
	db     *log.DB
	log    *hookLog
	runner *fakeRunner
	kicks  *kicks
	core   *conversation.Core
}

func newRig(t *testing.T, ag agents) *rig {
	t.Helper()
	db := openDB(t)
	r := &rig{db: db, log: &hookLog{DB: db}, runner: &fakeRunner{db: db}, kicks: &kicks{}}
	core, err := conversation.New(conversation.Config{Log: r.log, Agents: ag, Runner: r.runner, Outbox: r.kicks,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r.core = core
	return r
}

func userRecord(text string) record.Record {
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})
}

func admission(key record.Key, text string) log.Admission {
	return log.Admission{Key: key, Records: []record.Record{userRecord(text)}}
}

// admit admits through the core and fails the test on an error.
func (r *rig) admit(t *testing.T, key record.Key, text string) record.Submission {
	t.Helper()
	sub, replayed, err := r.core.Admit(context.Background(), admission(key, text))
	if err != nil || replayed {
		t.Fatalf("admit %s: %v (replayed %v)", key, err, replayed)
	}
	return sub
}

func (r *rig) sub(t *testing.T, id string) record.Submission {
	t.Helper()
	s, err := r.db.Submission(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (r *rig) pendingIDs(t *testing.T, key record.Key) []string {
	t.Helper()
	p, err := r.db.Pending(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range p {
		ids = append(ids, s.ID)
	}
	return ids
}

// settlements reads the settlement entries of key's current incarnation,
// by submission.
func settlements(t *testing.T, db *log.DB, key record.Key) map[string][]record.Settlement {
	t.Helper()
	out := map[string][]record.Settlement{}
	off := record.Start
	for {
		res, err := db.Read(context.Background(), key, off, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range res.Batches {
			recs, err := b.Records.Decode()
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range recs {
				if rec.Kind != record.KindEntry || rec.Entry.Type != record.EntrySettlement {
					continue
				}
				var st record.Settlement
				if err := json.Unmarshal(rec.Entry.Payload, &st); err != nil {
					t.Fatal(err)
				}
				out[st.SubmissionID] = append(out[st.SubmissionID], st)
			}
		}
		off = res.NextOffset
		if res.UpToDate {
			return out
		}
	}
}

// settledOnce asserts that id has exactly one settlement in m, with
// outcome and (if not "") error code.
func settledOnce(t *testing.T, m map[string][]record.Settlement, id string, outcome record.Outcome, code string) {
	t.Helper()
	sts := m[id]
	if len(sts) != 1 {
		t.Fatalf("submission %s: %d settlements %+v, want 1", id, len(sts), sts)
	}
	if sts[0].Outcome != outcome {
		t.Fatalf("submission %s settled %s, want %s", id, sts[0].Outcome, outcome)
	}
	if code != "" && (sts[0].Error == nil || sts[0].Error.Code != code) {
		t.Fatalf("submission %s: error %+v, want code %s", id, sts[0].Error, code)
	}
}
