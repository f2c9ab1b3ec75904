package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// benchRedisStore is the Redis Streams baseline: a stream per session, XADD to
// append (the entry id is the offset), XRANGE to read, and one XREAD BLOCK
// loop per tailed session (on its own connection) that wakes the local
// readers, who then XRANGE their new entries.
type benchRedisStore struct {
	rdb    *redis.Client
	prefix string
	w      benchWaiters
	config string
	owner  bool

	mu      sync.Mutex
	tailers map[string]bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// openBenchRedis opens the baseline's streams under prefix; the owner
// (the bench) deletes them on close.
func openBenchRedis(ctx context.Context, addr string, poolSize int, prefix string, owner bool) (*benchRedisStore, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize, DialTimeout: 5 * time.Second})
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, err
	}
	s := &benchRedisStore{rdb: rdb, prefix: prefix, tailers: map[string]bool{}, owner: owner}
	s.config = benchRedisPersistence(pctx, rdb)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// benchRedisPersistence is what the server keeps on disk, from its config.
func benchRedisPersistence(ctx context.Context, rdb *redis.Client) string {
	var parts []string
	for _, k := range []string{"appendonly", "appendfsync", "save"} {
		v, err := rdb.ConfigGet(ctx, k).Result()
		if err != nil {
			parts = append(parts, k+"=?")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%q", k, v[k]))
	}
	return strings.Join(parts, ", ")
}

func (s *benchRedisStore) key(session string) string { return s.prefix + session }

func (s *benchRedisStore) append(ctx context.Context, session string, records []byte) (string, error) {
	return s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: s.key(session), Values: []any{"r", records}}).Result()
}

func (s *benchRedisStore) read(ctx context.Context, session, after string, limit int) ([]benchStoredRow, error) {
	start := "-"
	if after != "0" {
		start = "(" + after
	}
	msgs, err := s.rdb.XRangeN(ctx, s.key(session), start, "+", int64(limit)).Result()
	if err != nil {
		return nil, err
	}
	out := make([]benchStoredRow, len(msgs))
	for i, m := range msgs {
		r, _ := m.Values["r"].(string)
		out[i] = benchStoredRow{id: m.ID, records: []byte(r)}
	}
	return out, nil
}

// subscribe starts the session's tailer on first use; it runs until close.
func (s *benchRedisStore) subscribe(session string) (<-chan struct{}, func()) {
	ch, release, _ := s.w.subscribe(session)
	s.mu.Lock()
	started := s.tailers[session]
	s.tailers[session] = true
	s.mu.Unlock()
	if !started {
		// Where the stream ends now, before the caller reads: anything
		// appended later wakes it.
		last := "0"
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		if msgs, err := s.rdb.XRevRangeN(ctx, s.key(session), "+", "-", 1).Result(); err == nil && len(msgs) == 1 {
			last = msgs[0].ID
		}
		cancel()
		s.wg.Add(1)
		go s.tailLoop(session, last)
	}
	return ch, release
}

func (s *benchRedisStore) tailLoop(session, last string) {
	defer s.wg.Done()
	for s.ctx.Err() == nil {
		res, err := s.rdb.XRead(s.ctx, &redis.XReadArgs{Streams: []string{s.key(session), last}, Block: time.Second, Count: 1000}).Result()
		if err != nil {
			if errors.Is(err, redis.Nil) {
				continue
			}
			if s.ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for _, st := range res {
			if n := len(st.Messages); n > 0 {
				last = st.Messages[n-1].ID
			}
		}
		s.w.wake(session)
	}
}

func (s *benchRedisStore) tail(ctx context.Context, session string) (string, error) {
	msgs, err := s.rdb.XRevRangeN(ctx, s.key(session), "+", "-", 1).Result()
	if err != nil {
		return "", err
	}
	if len(msgs) == 0 {
		return "0", nil
	}
	return msgs[0].ID, nil
}

func (s *benchRedisStore) load(ctx context.Context, rows []benchLoadRow) error {
	for i := 0; i < len(rows); i += 1000 {
		pipe := s.rdb.Pipeline()
		for _, r := range rows[i:min(i+1000, len(rows))] {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: s.key(r.session), Values: []any{"r", r.records}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (s *benchRedisStore) durability() string {
	return s.config + ": **nothing on disk; a crash or restart loses every stream — less durable than convlog**"
}

func (s *benchRedisStore) tailing() string {
	return "one XREAD BLOCK per session wakes the readers; each reader XRANGEs its new entries"
}

func (s *benchRedisStore) close() error {
	s.cancel()
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if !s.owner {
		return s.rdb.Close()
	}
	iter := s.rdb.Scan(ctx, 0, s.prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		errs = append(errs, err)
	}
	for i := 0; i < len(keys); i += 1000 {
		if err := s.rdb.Unlink(ctx, keys[i:min(i+1000, len(keys))]...).Err(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, s.rdb.Close())
	return errors.Join(errs...)
}

// benchRedisVersion describes the server for the report.
func benchRedisVersion(ctx context.Context, addr string) string {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 3 * time.Second})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "unavailable (" + benchOneLine(err.Error()) + ")"
	}
	v := "?"
	for _, l := range strings.Split(info, "\n") {
		if x, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			v = x
		}
	}
	return fmt.Sprintf("%s on 127.0.0.1:6379, %s", v, benchRedisPersistence(ctx, rdb))
}
