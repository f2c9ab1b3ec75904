package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/convlog/convlog/log/record"
)

// The baselines a team would build instead of convlog, served through the
// same HTTP shape so that the same load generator drives them:
//

//	POST /agents/{agent}/{instance}                 decode, build the user record, append one row, 202
//	GET  /agents/{agent}/{instance}/conversation    rows after ?offset= as {"batches":[…],"nextOffset","upToDate"}
//	GET  /agents/{agent}/{instance}/stream          SSE: rows after ?offset=, then tail
//

// A row is a batch: the same JSON record array convlog stores. Offsets
// are the store's own row ids (PostgreSQL: a bigserial; Redis: the stream
// entry id); "0" is the start. The server is a few hundred lines of
// net/http in this process, as lean as such a service would be; it has
// no agent, so nothing answers the messages.

var benchBaselines = []string{"postgres", "redis"}

func benchSystemLabel(sys string) string {
	switch sys {
	case "postgres":
		return "PostgreSQL + LISTEN/NOTIFY"
	case "redis":
		return "Redis Streams"
	case "convlog-parked":
		return "convlog, agent parked"
	case "floor":
		return "floor: do-nothing server"
	}
	return sys
}

type benchStoredRow struct {
	id      string
	records []byte
}

type benchLoadRow struct {
	session string
	records []byte
}

// benchStore is an append log of rows per session with a way to wait
// for the next append.
type benchStore interface {
	append(ctx context.Context, session string, records []byte) (id string, err error)
	// read returns up to limit rows after the row with id after ("0":
	// from the start).
	read(ctx context.Context, session, after string, limit int) ([]benchStoredRow, error)
	// subscribe returns a channel closed by the next append to session.
	// Subscribe, then read: an append in between still closes it.
	subscribe(session string) (<-chan struct{}, func())
	tail(ctx context.Context, session string) (string, error)
	load(ctx context.Context, rows []benchLoadRow) error
	durability() string
	tailing() string
	close() error
}

// benchBaselinePage bounds a page in rows: 1,000 rows of 10-record batches is
// the 10,000 records convlog serves with limit=10000.
const benchBaselinePage = 1000

type benchBaselineServer struct {
	store benchStore
	srv   *http.Server
	addr  string
	child *benchChild // the server's process; nil when served in this one

	closing chan struct{}
}

// withBaseline runs fn against a fresh baseline: this process owns the
// store (creates the table or key prefix, loads data, drops it after) and
// the HTTP server runs in a child process of its own (`convlog bench
// -child -baseline SYS`), as convlog's does, so both sides have the same
// process topology: load generator here, server there, store behind it.
func (e *benchEnv) withBaseline(ctx context.Context, sys string, fn func(b *benchBaselineServer) error) error {
	var (
		st   benchStore
		args []string
		err  error
	)
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	switch sys {
	case "postgres":
		channel := "convlog_bench_" + suffix
		st, err = openBenchPG(ctx, e.opts.pgDSN, 4, channel, true)
		args = []string{"-baseline", sys, "-postgres", e.opts.pgDSN, "-postgres-conns", strconv.Itoa(e.opts.pgConns), "-channel", channel}
	case "redis":
		prefix := "convlog-bench:" + suffix + ":"
		st, err = openBenchRedis(ctx, e.opts.redisAddr, 16, prefix, true)
		args = []string{"-baseline", sys, "-redis", e.opts.redisAddr, "-prefix", prefix}
	case "floor":
		st, args = newBenchFloorStore(), []string{"-baseline", sys}
	default:
		err = fmt.Errorf("unknown baseline %q", sys)
	}
	if err != nil {
		return err
	}
	c, err := startBenchChild(ctx, args)
	if err != nil {
		return errors.Join(err, st.close())
	}
	ferr := fn(&benchBaselineServer{store: st, addr: c.addr, child: c})
	return errors.Join(ferr, c.stop(), st.close())
}

// serveBaseline serves store's HTTP shape on 127.0.0.1:0.
func serveBaseline(store benchStore) (*benchBaselineServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &benchBaselineServer{store: store, addr: ln.Addr().String(), closing: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /agents/{agent}/{instance}", b.deliver)
	mux.HandleFunc("GET /agents/{agent}/{instance}/conversation", b.conversation)
	mux.HandleFunc("GET /agents/{agent}/{instance}/stream", b.stream)
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-b.closing; cancel() }()
			return ctx
		}}
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

// shutdown ends streams and stops the server.
func (b *benchBaselineServer) shutdown(ctx context.Context) error {
	close(b.closing)
	return b.srv.Shutdown(ctx)
}

func benchULID() string { return ulid.Make().String() }

func benchHTTPError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": http.StatusText(status), "message": msg}})
	_, _ = w.Write(b)
}

func (b *benchBaselineServer) deliver(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 8<<20))
	if err != nil {
		benchHTTPError(w, http.StatusBadRequest, err.Error())
		return
	}
	var req struct {
		Message struct {
			Kind string `json:"kind"`
			Body string `json:"body"`
		} `json:"message"`
		Session string `json:"session"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.Message.Kind != "user" || strings.TrimSpace(req.Message.Body) == "" {
		benchHTTPError(w, http.StatusBadRequest, "bad delivery")
		return
	}
	if req.Session == "" {
		req.Session = record.DefaultSession
	}
	if record.ValidateName(req.Session) != nil {
		benchHTTPError(w, http.StatusBadRequest, "bad session")
		return
	}
	payload, _ := json.Marshal(record.MessagePayload{Parts: []record.Part{{Type: record.PartText, Text: req.Message.Body}}})
	sub := "sub_" + benchULID()
	records, err := json.Marshal([]record.Record{record.EntryRecord(record.Entry{
		ID: benchULID(), Timestamp: time.Now().UTC(), Type: record.EntryUserMessage, SubmissionID: sub, Payload: payload,
	})})
	if err != nil {
		benchHTTPError(w, http.StatusInternalServerError, err.Error())
		return
	}
	id, err := b.store.append(r.Context(), req.Session, records)
	if err != nil {
		benchHTTPError(w, http.StatusInternalServerError, err.Error())
		return
	}
	resp, _ := json.Marshal(map[string]string{"submissionId": sub, "offset": id})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(resp)
}

func benchSessionOffset(r *http.Request) (string, string, error) {
	q := r.URL.Query()
	session := q.Get("session")
	if session == "" {
		session = record.DefaultSession
	}
	if err := record.ValidateName(session); err != nil {
		return "", "", err
	}
	off := q.Get("offset")
	if off == "" {
		off = "0"
	}
	return session, off, nil
}

func benchAppendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s)
	return append(b, q...)
}

func (b *benchBaselineServer) conversation(w http.ResponseWriter, r *http.Request) {
	session, off, err := benchSessionOffset(r)
	if err != nil {
		benchHTTPError(w, http.StatusBadRequest, err.Error())
		return
	}
	limit := benchBaselinePage
	if v, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && v > 0 && v < limit {
		limit = v
	}
	rows, err := b.store.read(r.Context(), session, off, limit)
	if err != nil {
		benchHTTPError(w, http.StatusInternalServerError, err.Error())
		return
	}
	size := 64
	for _, row := range rows {
		size += len(row.records) + 48
	}
	out := make([]byte, 0, size)
	out = append(out, `{"batches":[`...)
	prev := off
	for i, row := range rows {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"offset":`...)
		out = benchAppendJSONString(out, prev)
		out = append(out, `,"records":`...)
		out = append(out, row.records...)
		out = append(out, '}')
		prev = row.id
	}
	out = append(out, `],"nextOffset":`...)
	out = benchAppendJSONString(out, prev)
	out = append(out, `,"upToDate":`...)
	out = strconv.AppendBool(out, len(rows) < limit)
	out = append(out, '}')
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

func (b *benchBaselineServer) stream(w http.ResponseWriter, r *http.Request) {
	session, off, err := benchSessionOffset(r)
	if err != nil {
		benchHTTPError(w, http.StatusBadRequest, err.Error())
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if _, err := io.WriteString(w, ": connected\n\n"); err != nil || rc.Flush() != nil {
		return
	}
	ctx := r.Context()
	buf := make([]byte, 0, 4096)
	for {
		ch, release := b.store.subscribe(session)
		rows, err := b.store.read(ctx, session, off, benchBaselinePage)
		if err != nil {
			release()
			if ctx.Err() == nil {
				e, _ := json.Marshal(map[string]string{"type": "error", "message": err.Error()})
				_, _ = fmt.Fprintf(w, "data: %s\n\n", e)
				_ = rc.Flush()
			}
			return
		}
		for _, row := range rows {
			buf = append(buf[:0], "id: "...)
			buf = append(buf, row.id...)
			buf = append(buf, "\ndata: {\"type\":\"conversation\",\"offset\":"...)
			buf = benchAppendJSONString(buf, off)
			buf = append(buf, `,"nextOffset":`...)
			buf = benchAppendJSONString(buf, row.id)
			buf = append(buf, `,"records":`...)
			buf = append(buf, row.records...)
			buf = append(buf, "}\n\n"...)
			if _, err := w.Write(buf); err != nil {
				release()
				return
			}
			off = row.id
		}
		if err := rc.Flush(); err != nil {
			release()
			return
		}
		if len(rows) == benchBaselinePage {
			release()
			continue
		}
		select {
		case <-ch:
			release()
		case <-ctx.Done():
			release()
			return
		}
	}
}

// benchWaiters wakes the readers of a session, as convlog's log does: one
// channel per waited-on session, closed by the next append.
type benchWaiters struct {
	mu    sync.Mutex
	slots map[string]*benchWaitSlot
}

type benchWaitSlot struct {
	ch   chan struct{}
	refs int
}

func (n *benchWaiters) subscribe(k string) (<-chan struct{}, func(), bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.slots == nil {
		n.slots = map[string]*benchWaitSlot{}
	}
	s := n.slots[k]
	first := s == nil
	if first {
		s = &benchWaitSlot{ch: make(chan struct{})}
		n.slots[k] = s
	}
	s.refs++
	return s.ch, func() {
		n.mu.Lock()
		s.refs--
		if s.refs == 0 && n.slots[k] == s {
			delete(n.slots, k)
		}
		n.mu.Unlock()
	}, first
}

func (n *benchWaiters) wake(k string) {
	n.mu.Lock()
	if s := n.slots[k]; s != nil {
		close(s.ch)
		delete(n.slots, k)
	}
	n.mu.Unlock()
}
