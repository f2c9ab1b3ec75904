package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"

	"github.com/convlog/convlog/internal/boltceiling"
)

// The ceilings: what the layers under convlog can do at best on this
// machine in this run, with the admission workload's shape (64 concurrent
// writers, 256-byte values), and no HTTP, no JSON, no engine logic.

const secBenchCeilings = "0. Ceilings"

func (e *benchEnv) ceilings(ctx context.Context) error {
	var errs []error
	w := fmt.Sprintf("%d concurrent writers, 256 B values, %s", e.sz.clients, e.sz.ceilingWindow)
	// One writer: the latency of one durable commit, the floor under any
	// single request that waits for an fsync.
	if r, err := e.bboltWriters(ctx, 1, e.sz.ceilingWindow/2); err != nil {
		errs = append(errs, fmt.Errorf("bbolt: %w", err))
	} else {
		e.rep.set("ceiling.bbolt1", r.rate())
		e.rep.add(benchRow{section: secBenchCeilings, workload: "bare bbolt, one writer: the latency of one fsynced commit (the floor under any durable request)", system: "bbolt",
			lat: e.rep.latVals("ceiling.bbolt1", r.lat), rate: r.rate(), unit: "commits/s", other: "two fdatasyncs per bbolt commit (pages, then meta)"})
	}
	if r, err := e.bboltCeiling(ctx); err != nil {
		errs = append(errs, fmt.Errorf("bbolt: %w", err))
	} else {
		e.rep.set("ceiling.bbolt", r.rate())
		e.rep.add(benchRow{section: secBenchCeilings, workload: "bare bbolt group commit (one fsynced tx per drain, no timer): " + w, system: "bbolt",
			lat: e.rep.latVals("ceiling.bbolt", r.lat), rate: r.rate(), unit: "puts/s", other: "fsync per commit"})
		e.logf("bbolt ceiling: %s puts/s", fmtCount(r.rate()))
	}
	for _, syncAlways := range []bool{false, true} {
		r, err := e.jetstreamCeiling(ctx, syncAlways)
		key, label, other := "ceiling.js", "JetStream publish-with-ack, file storage (default sync: fsync every 2 min)", "acked before fsync: less durable than convlog"
		if syncAlways {
			key, label, other = "ceiling.jssync", "JetStream publish-with-ack, file storage, sync_always", "fsync before each ack"
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("jetstream: %w", err))
			continue
		}
		e.rep.set(key, r.rate())
		e.rep.add(benchRow{section: secBenchCeilings, workload: label + ": " + w, system: "JetStream (embedded)",
			lat: e.rep.latVals(key, r.lat), rate: r.rate(), unit: "acks/s", other: other})
		e.logf("%s: %s acks/s", key, fmtCount(r.rate()))
	}
	return errors.Join(errs...)
}

func (e *benchEnv) bboltCeiling(ctx context.Context) (benchResult, error) {
	return e.bboltWriters(ctx, e.sz.clients, e.sz.ceilingWindow)
}

func (e *benchEnv) bboltWriters(ctx context.Context, writers int, window time.Duration) (benchResult, error) {
	dir, err := os.MkdirTemp(e.tmp, "bbolt-")
	if err != nil {
		return benchResult{}, err
	}
	defer os.RemoveAll(dir)
	db, err := bolt.Open(filepath.Join(dir, "bare.db"), 0o600, &bolt.Options{InitialMmapSize: 1 << 30, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return benchResult{}, err
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		return benchResult{}, err
	}
	gc := boltceiling.New(db)
	defer gc.Close()
	value := bytes.Repeat([]byte("x"), 256)
	var seq [64]atomic.Uint64
	res := benchClosedLoop(ctx, writers, e.sz.warmup/2, window, 0, func(w int) error {
		k := make([]byte, 16)
		binary.BigEndian.PutUint64(k, uint64(w))
		binary.BigEndian.PutUint64(k[8:], seq[w%64].Add(1))
		return gc.Put(k, value)
	})
	if res.ok == 0 {
		return res, fmt.Errorf("no put succeeded: %v", res.firstErr)
	}
	return res, nil
}

// jetstreamCeiling: an embedded server with file storage, 64 publishers
// each waiting for its ack before the next publish.
func (e *benchEnv) jetstreamCeiling(ctx context.Context, syncAlways bool) (benchResult, error) {
	dir, err := os.MkdirTemp(e.tmp, "js-")
	if err != nil {
		return benchResult{}, err
	}
	defer os.RemoveAll(dir)
	opts := &server.Options{JetStream: true, StoreDir: dir, DontListen: true, NoSigs: true, NoLog: true, ServerName: "bench", SyncAlways: syncAlways}
	srv, err := server.NewServer(opts)
	if err != nil {
		return benchResult{}, err
	}
	go srv.Start()
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	if !srv.ReadyForConnections(30 * time.Second) {
		return benchResult{}, errors.New("jetstream not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		return benchResult{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return benchResult{}, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage}); err != nil {
		return benchResult{}, err
	}
	value := bytes.Repeat([]byte("x"), 256)
	var mu sync.Mutex
	_ = &mu
	res := benchClosedLoop(ctx, e.sz.clients, e.sz.warmup/2, e.sz.ceilingWindow, 0, func(w int) error {
		_, err := js.Publish(ctx, fmt.Sprintf("bench.%d", w), value)
		return err
	})
	if res.ok == 0 {
		return res, fmt.Errorf("no publish acked: %v", res.firstErr)
	}
	return res, nil
}
