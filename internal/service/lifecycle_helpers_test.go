package service

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/check"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
)

// raw is a plain HTTP client of the service: the lifecycle tests read the
// wire, not a client library's idea of it.
type raw struct {
	t    tb
	base string
}

// tb is what raw needs of a test: *testing.T and *rapid.T both have it.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func (r raw) do(method, path, body string, header map[string]string) (int, http.Header, []byte) {
	r.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, r.base+path, rd)
	if err != nil {
		r.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// must is do expecting status; it decodes the body into out (if not nil).
func (r raw) must(status int, method, path, body string, out any) []byte {
	r.t.Helper()
	got, _, b := r.do(method, path, body, nil)
	if got != status {
		r.t.Fatalf("%s %s %s: %d %s, want %d", method, path, body, got, b, status)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			r.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return b
}

// errCode is do expecting an error status and code.
func (r raw) errCode(status int, code, method, path, body string) map[string]any {
	r.t.Helper()
	got, _, b := r.do(method, path, body, nil)
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || got != status || e.Error["code"] != code {
		r.t.Fatalf("%s %s %s: %d %s, want %d %s", method, path, body, got, b, status, code)
	}
	return e.Error
}

type accepted struct {
	SubmissionID string        `json:"submissionId"`
	Offset       record.Offset `json:"offset"`
	UID          string        `json:"uid"`
	UpdatesURL   string        `json:"updatesUrl"`
}

func (r raw) deliver(instance, session, text string) accepted {
	r.t.Helper()
	body, _ := json.Marshal(map[string]string{"message": text, "session": session})
	var acc accepted
	r.must(202, "POST", "/agents/echo/"+instance, string(body), &acc)
	return acc
}

// settled long-polls a submission until it is terminal.
func (r raw) settled(instance, id string) record.Submission {
	r.t.Helper()
	var s record.Submission
	check.For(r.t, time.Minute, 10*time.Millisecond, func() error {
		s = record.Submission{}
		r.must(200, "GET", "/agents/echo/"+instance+"/submissions/"+id+"?wait=5s", "", &s)
		if !s.Status.Terminal() {
			return fmt.Errorf("submission %s is %s", id, s.Status)
		}
		return nil
	})
	return s
}

type page struct {
	UID         string             `json:"uid"`
	Incarnation record.Incarnation `json:"incarnation"`
	Batches     []record.Batch     `json:"batches"`
	NextOffset  record.Offset      `json:"nextOffset"`
	UpToDate    bool               `json:"upToDate"`
}

// fresh reads the whole conversation from "0".
func (r raw) fresh(instance, session string) (page, []record.Record) {
	r.t.Helper()
	off := record.Start
	var recs []record.Record
	for {
		var p page
		r.must(200, "GET", "/agents/echo/"+instance+"/conversation?session="+url.QueryEscape(session)+"&offset="+string(off), "", &p)
		for _, b := range p.Batches {
			rs, err := b.Records.Decode()
			if err != nil {
				r.t.Fatal(err)
			}
			recs = append(recs, rs...)
		}
		off = p.NextOffset
		if p.UpToDate {
			return p, recs
		}
	}
}

type checkpoint struct {
	EntryID      string        `json:"entryId"`
	SubmissionID string        `json:"submissionId"`
	Offset       record.Offset `json:"offset"`
	Preview      string        `json:"preview"`
}

func (r raw) checkpoints(instance, session string) []checkpoint {
	r.t.Helper()
	var out struct {
		Checkpoints []checkpoint `json:"checkpoints"`
	}
	r.must(200, "GET", "/agents/echo/"+instance+"/checkpoints?session="+url.QueryEscape(session), "", &out)
	return out.Checkpoints
}

// msg is a message as the tests compare them: role and text.
type msg struct{ Role, Text string }

func messagesOf(recs []record.Record) []msg {
	out := []msg{}
	for _, m := range projection.Project(recs).Messages {
		var b strings.Builder
		for _, p := range m.Parts {
			b.WriteString(p.Text)
		}
		out = append(out, msg{m.Role, b.String()})
	}
	return out
}

// sseReader follows a conversation over SSE for as long as the test runs,
// applying the reader's checklist: records accumulate per incarnation, a
// reset frame drops them (the stream goes on from "0" of the new one), and
// truncations are left to the projection, which drops what follows
// rewoundTo.
type sseReader struct {
	mu      sync.Mutex
	inc     record.Incarnation
	lastID  string
	records []record.Record
	frames  []string // types, in order
	ended   bool
	err     error
	done    chan struct{}
	cancel  context.CancelFunc
}

func follow(t testing.TB, base, instance, session string) *sseReader {
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/agents/echo/"+instance+"/stream?session="+session+"&offset=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	s := &sseReader{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		err := scanSSE(resp.Body, func(id string, data []byte) bool { s.frame(id, data); return false })
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
	}()
	t.Cleanup(func() { cancel(); <-s.done })
	return s
}

// scanSSE calls frame with each event's id and data until frame returns
// true (then nil), or the stream ends (its read error).
func scanSSE(r io.Reader, frame func(id string, data []byte) (stop bool)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var id string
	var data bytes.Buffer
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case strings.HasPrefix(line, "data: "):
			data.WriteString(line[6:])
		case line == "" && data.Len() > 0:
			if frame(id, data.Bytes()) {
				return nil
			}
			id = ""
			data.Reset()
		}
	}
	return sc.Err()
}

func (s *sseReader) frame(id string, data []byte) {
	var f struct {
		Type        string             `json:"type"`
		Incarnation record.Incarnation `json:"incarnation"`
		Records     []record.Record    `json:"records"`
	}
	if json.Unmarshal(data, &f) != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frames = append(s.frames, f.Type)
	switch f.Type {
	case "conversation":
		s.inc = f.Incarnation
		s.records = append(s.records, f.Records...)
	case "reset":
		s.inc, s.records = f.Incarnation, nil
	case "ended":
		s.ended, s.records = true, nil
	}
	if id != "" {
		s.lastID = id
	}
}

// caughtUp reports whether the reader has what a fresh read has.
func (s *sseReader) caughtUp(p page) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inc == p.Incarnation && s.lastID == string(p.NextOffset)
}

func (s *sseReader) snapshot() []record.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]record.Record(nil), s.records...)
}

// eventually polls cond until it holds, or fails after a minute.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	check.For(t, time.Minute, 5*time.Millisecond, func() error {
		if !cond() {
			return errors.New(what)
		}
		return nil
	})
}
