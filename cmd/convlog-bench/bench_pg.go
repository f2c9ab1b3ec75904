package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// benchPGStore is the PostgreSQL baseline: one append table, a row per batch,
// the primary key (session, id) for reads, and LISTEN/NOTIFY for tailing:
// the append and its NOTIFY are one statement, so one transaction, and the
// notification goes out at commit. One LISTEN connection per server wakes
// the local readers of the session named in the payload; each reader then
// SELECTs its new rows.
type benchPGStore struct {
	pool    *pgxpool.Pool
	table   string
	channel string
	w       benchWaiters
	cancel  context.CancelFunc
	done    chan struct{}
	sync    string // synchronous_commit, fsync as the server reports them
	owner   bool

	listenErr error
	mu        sync.Mutex
}

// openBenchPG opens the baseline's table. The owner (the bench) drops and
// creates it, and drops it on close; the server (owner false) LISTENs on
// channel and NOTIFYs it with each append.
func openBenchPG(ctx context.Context, dsn string, conns int, channel string, owner bool) (*benchPGStore, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	octx, ocancel := context.WithTimeout(ctx, 20*time.Second)
	defer ocancel()
	pool, err := pgxpool.NewWithConfig(octx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(octx); err != nil {
		pool.Close()
		return nil, err
	}
	s := &benchPGStore{pool: pool, table: "convlog_bench_log", channel: channel, done: make(chan struct{}), owner: owner}
	var sc, fs string
	if err := pool.QueryRow(octx, "SELECT current_setting('synchronous_commit'), current_setting('fsync')").Scan(&sc, &fs); err != nil {
		pool.Close()
		return nil, err
	}
	s.sync = fmt.Sprintf("synchronous_commit=%s, fsync=%s", sc, fs)
	if owner {
		for _, q := range []string{
			"DROP TABLE IF EXISTS " + s.table,
			"CREATE TABLE " + s.table + " (session text NOT NULL, id bigserial NOT NULL, records text NOT NULL, PRIMARY KEY (session, id))",
		} {
			if _, err := pool.Exec(octx, q); err != nil {
				pool.Close()
				return nil, fmt.Errorf("%s: %w", q, err)
			}
		}
		s.cancel = func() {}
		close(s.done)
		return s, nil
	}
	lconn, err := pgx.ConnectConfig(octx, cfg.ConnConfig.Copy())
	if err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := lconn.Exec(octx, "LISTEN "+s.channel); err != nil {
		lconn.Close(ctx)
		pool.Close()
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		defer lconn.Close(context.Background())
		for {
			n, err := lconn.WaitForNotification(lctx)
			if err != nil {
				if lctx.Err() == nil {
					s.mu.Lock()
					s.listenErr = err
					s.mu.Unlock()
				}
				return
			}
			session, _, _ := strings.Cut(n.Payload, " ")
			s.w.wake(session)
		}
	}()
	return s, nil
}

func (s *benchPGStore) append(ctx context.Context, session string, records []byte) (string, error) {
	var id int64
	err := s.pool.QueryRow(ctx,
		`WITH ins AS (INSERT INTO `+s.table+` (session, records) VALUES ($1, $2) RETURNING id)
		 SELECT id FROM ins, LATERAL (SELECT pg_notify($3, $1 || ' ' || ins.id)) n`,
		session, string(records), s.channel).Scan(&id)
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(id, 10), nil
}

func (s *benchPGStore) read(ctx context.Context, session, after string, limit int) ([]benchStoredRow, error) {
	a, err := strconv.ParseInt(after, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("offset %q: %w", after, err)
	}
	rows, err := s.pool.Query(ctx, `SELECT id, records FROM `+s.table+` WHERE session = $1 AND id > $2 ORDER BY id LIMIT $3`, session, a, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []benchStoredRow
	for rows.Next() {
		var id int64
		var rec []byte
		if err := rows.Scan(&id, &rec); err != nil {
			return nil, err
		}
		out = append(out, benchStoredRow{id: strconv.FormatInt(id, 10), records: rec})
	}
	return out, rows.Err()
}

func (s *benchPGStore) subscribe(session string) (<-chan struct{}, func()) {
	ch, release, _ := s.w.subscribe(session)
	return ch, release
}

func (s *benchPGStore) tail(ctx context.Context, session string) (string, error) {
	var id *int64
	if err := s.pool.QueryRow(ctx, `SELECT max(id) FROM `+s.table+` WHERE session = $1`, session).Scan(&id); err != nil {
		return "", err
	}
	if id == nil {
		return "0", nil
	}
	return strconv.FormatInt(*id, 10), nil
}

func (s *benchPGStore) load(ctx context.Context, rows []benchLoadRow) error {
	_, err := s.pool.CopyFrom(ctx, pgx.Identifier{s.table}, []string{"session", "records"},
		pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
			return []any{rows[i].session, string(rows[i].records)}, nil
		}))
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, "ANALYZE "+s.table)
	return err
}

func (s *benchPGStore) durability() string {
	return s.sync + ": each 202 follows a fsynced commit, as durable as convlog's"
}

func (s *benchPGStore) tailing() string {
	return "one LISTEN connection wakes the readers; each reader SELECTs its new rows"
}

func (s *benchPGStore) close() error {
	s.cancel()
	<-s.done
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var derr error
	if s.owner {
		_, derr = s.pool.Exec(ctx, "DROP TABLE IF EXISTS "+s.table)
	}
	s.pool.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(derr, s.listenErr)
}

// benchPGVersion describes the server for the report.
func benchPGVersion(ctx context.Context, dsn string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "unavailable (" + benchOneLine(err.Error()) + ")"
	}
	defer conn.Close(context.Background())
	var v, sc, fs, wsm, sb, cd string
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('fsync'),
		current_setting('wal_sync_method'), current_setting('shared_buffers'), current_setting('commit_delay')`).Scan(&v, &sc, &fs, &wsm, &sb, &cd); err != nil {
		return "unavailable (" + benchOneLine(err.Error()) + ")"
	}
	return fmt.Sprintf("%s on 127.0.0.1:5432, synchronous_commit=%s, fsync=%s, wal_sync_method=%s, shared_buffers=%s, commit_delay=%s (defaults)", v, sc, fs, wsm, sb, cd)
}
