package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
)

// benchFloorStore is the do-nothing server's store: rows in memory, no
// disk, no agent, numeric offsets. Served by the same net/http baseline
// server, each reader gets each POST's frame in one write and one flush:
// what any server of this wire shape must pay per reader on this machine
// (the floor the 10,000-reader target is measured against).
type benchFloorStore struct {
	w benchWaiters

	mu   sync.Mutex
	rows map[string][][]byte
}

func newBenchFloorStore() *benchFloorStore { return &benchFloorStore{rows: map[string][][]byte{}} }

func (s *benchFloorStore) append(_ context.Context, session string, records []byte) (string, error) {
	s.mu.Lock()
	s.rows[session] = append(s.rows[session], records)
	id := strconv.Itoa(len(s.rows[session]))
	s.mu.Unlock()
	s.w.wake(session)
	return id, nil
}

func (s *benchFloorStore) read(_ context.Context, session, after string, limit int) ([]benchStoredRow, error) {
	from, err := strconv.Atoi(after)
	if err != nil || from < 0 {
		return nil, fmt.Errorf("offset %q: not a row number", after)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rows := s.rows[session]
	var out []benchStoredRow
	for i := from; i < len(rows) && len(out) < limit; i++ {
		out = append(out, benchStoredRow{id: strconv.Itoa(i + 1), records: rows[i]})
	}
	return out, nil
}

func (s *benchFloorStore) subscribe(session string) (<-chan struct{}, func()) {
	ch, release, _ := s.w.subscribe(session)
	return ch, release
}

// tail is the child's: the parent's copy of the store holds nothing.
func (s *benchFloorStore) tail(context.Context, string) (string, error) {
	return "", fmt.Errorf("the floor's rows are in its server process")
}

func (s *benchFloorStore) load(_ context.Context, rows []benchLoadRow) error {
	for _, r := range rows {
		_, _ = s.append(context.Background(), r.session, r.records)
	}
	return nil
}

func (s *benchFloorStore) durability() string { return "memory only, nothing on disk" }
func (s *benchFloorStore) tailing() string {
	return "do-nothing floor: rows in memory, no agent, one write and flush per reader per POST"
}
func (s *benchFloorStore) close() error { return nil }

// benchFloorTail asks the floor's server for the session's tail.
func benchFloorTail(ctx context.Context, client *http.Client, addr, session string) (string, error) {
	st, b, err := benchGet(ctx, client, "http://"+addr+"/agents/"+benchAgent+"/"+benchInstance+"/conversation?session="+session+"&offset=0")
	if err != nil {
		return "", err
	}
	if err := benchWantStatus(st, http.StatusOK, b); err != nil {
		return "", err
	}
	var res struct {
		NextOffset string `json:"nextOffset"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return "", err
	}
	return res.NextOffset, nil
}
