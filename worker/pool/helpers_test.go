package pool_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
)

// rig is a log, an embedded NATS, a relay and a pool, all real, in a temp
// folder, stopped with the test.
type rig struct {
	db     *clog.DB
	nc     *nats.Conn
	agents *pool.Registry
	bus    *natsbus.DeltaBus
	relay  *natsbus.Relay
	pool   *pool.Pool
	stop   func()
}

func startRig(t *testing.T, register func(*pool.Registry)) *rig {
	t.Helper()
	return startRigIn(t, t.TempDir(), register)
}

func startRigIn(t *testing.T, dir string, register func(*pool.Registry)) *rig {
	t.Helper()
	return startRigWith(t, dir, register, rigOptions{})
}

type rigOptions struct {
	// wrap wraps the pool's view of the log, so that a test can step in
	// between the pool and the log.
	wrap     func(pool.Log) pool.Log
	leaseTTL time.Duration
	sweep    time.Duration
	scanPage int
	// poolNamespace, when set, makes the pool deaf to the relay's
	// doorbells: only recovery and sweeps find its work.
	poolNamespace natsbus.Namespace
	observer      pool.Observer
	logger        *slog.Logger
}

func startRigWith(t *testing.T, dir string, register func(*pool.Registry), o rigOptions) *rig {
	t.Helper()
	db, err := clog.Open(filepath.Join(dir, "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natsbus.StartEmbedded(filepath.Join(dir, "nats"), "")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := ns.Connect()
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{db: db, nc: nc, agents: pool.NewRegistry()}
	if err := r.agents.Register("echo", worker.Echo{}, ""); err != nil {
		t.Fatal(err)
	}
	if register != nil {
		register(r.agents)
	}
	if r.bus, err = natsbus.NewDeltaBus(nc, ""); err != nil {
		t.Fatal(err)
	}
	if r.relay, err = natsbus.NewRelay(db, nc, "", nil); err != nil {
		t.Fatal(err)
	}
	var plog pool.Log = db
	if o.wrap != nil {
		plog = o.wrap(db)
	}
	if r.pool, err = pool.NewPool(pool.Config{Log: plog, NATS: nc, Agents: r.agents, Deltas: r.bus, ShutdownTimeout: time.Second,
		LeaseTTL: o.leaseTTL, SweepInterval: o.sweep, ScanPage: o.scanPage, Namespace: o.poolNamespace, Observer: o.observer, Logger: o.logger}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- r.relay.Run(ctx) }()
	go func() { done <- r.pool.Run(ctx) }()
	var stopped bool
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
		r.bus.Close()
		nc.Close()
		ns.Shutdown()
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(r.stop)
	return r
}

func userRecord(text string) record.Record {
	p, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: text}}})
	return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p})
}

// admit admits a message and kicks the relay, as the HTTP layer does.
func (r *rig) admit(t *testing.T, key record.Key, text string) record.Submission {
	t.Helper()
	s, _, err := r.db.Admit(context.Background(), clog.Admission{Key: key, Records: []record.Record{userRecord(text)}})
	if err != nil {
		t.Fatal(err)
	}
	r.relay.Kick()
	return s
}

// settled waits, without polling, until the submission is terminal.
func (r *rig) settled(t *testing.T, id string) record.Submission {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		s, err := r.db.Submission(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Status.Terminal() {
			return s
		}
		_, tail, err := r.db.Tail(ctx, s.Key)
		if err != nil {
			t.Fatal(err)
		}
		inc, _, _ := r.db.Tail(ctx, s.Key)
		if err := r.db.Wait(ctx, s.Key, tail, inc); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("submission %s not settled in 30s: %+v", id, s)
			}
			t.Fatal(err)
		}
	}
}

// records reads the whole stream.
func (r *rig) records(t *testing.T, key record.Key) []record.Record {
	t.Helper()
	var out []record.Record
	off := record.Start
	for {
		res, err := r.db.Read(context.Background(), key, off, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range res.Batches {
			recs, err := b.Records.Decode()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, recs...)
		}
		off = res.NextOffset
		if res.UpToDate {
			return out
		}
	}
}
