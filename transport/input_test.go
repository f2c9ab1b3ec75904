package transport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/wire"
)

// Input that encoding/json would accept and silently alter is refused with
// a code: invalid UTF-8 and lone surrogates (stored as U+FFFD), duplicate
// keys (the last would win), numbers beyond float64 (kept as text that
// JavaScript reads as Infinity).
func TestDeliverRefusesAlteredInput(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ name, body, code string }{
		{"raw invalid UTF-8 in the message", "{\"message\":\"hi \xff there\"}", wire.CodeInvalidUTF8},
		{"raw invalid UTF-8 in a key", "{\"message\":{\"kind\":\"user\",\"body\":\"x\",\"metadata\":{\"\xc3\x28\":1}}}", wire.CodeInvalidUTF8},
		{"lone low surrogate in the message", `{"message":"hi \udc00"}`, wire.CodeInvalidUTF8},
		{"lone high surrogate in the uid", `{"message":"hi","uid":"gen-\ud800"}`, wire.CodeInvalidUTF8},
		{"high surrogate then a non-surrogate", `{"message":"hi \ud800\u0041"}`, wire.CodeInvalidUTF8},
		{"duplicate top-level key", `{"message":"a","message":"b"}`, wire.CodeDuplicateKey},
		{"duplicate key in metadata", `{"message":{"kind":"user","body":"x","metadata":{"a":1,"b":{},"a":2}}}`, wire.CodeDuplicateKey},
		{"duplicate key in a part", `{"message":{"kind":"user","parts":[{"type":"text","text":"a","text":"b"}]}}`, wire.CodeDuplicateKey},
		{"huge exponent in metadata", `{"message":{"kind":"user","body":"x","metadata":{"n":1e999999}}}`, wire.CodeNumberOutOfRange},
		{"huge negative in initialData", `{"message":"x","initialData":[-1e400]}`, wire.CodeNumberOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, b := e.postJSON(t, "/agents/echo/i1", tc.body, nil)
			if status != http.StatusBadRequest {
				t.Fatalf("status %d: %s", status, b)
			}
			if got := errorOf(t, b)["code"]; got != tc.code {
				t.Fatalf("code %v, want %s: %s", got, tc.code, b)
			}
		})
	}
	if e.admitted.Load() != 0 {
		t.Fatalf("%d refused deliveries were admitted", e.admitted.Load())
	}

	// What looks alike but is fine still passes, unaltered.
	for _, body := range []string{
		`{"message":"smile \ud83d\ude00 \\ud800 is text"}`,
		`{"message":{"kind":"user","body":"x","metadata":{"body":1,"kind":{"kind":2},"n":1e308,"m":1e-999999}}}`,
		`{"message":{"kind":"user","parts":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}`,
	} {
		if status, _, b := e.postJSON(t, "/agents/echo/ok", body, nil); status != http.StatusAccepted {
			t.Fatalf("%s: status %d: %s", body, status, b)
		}
	}
	res, err := e.c.Read(testCtx(t), "echo", "ok", "", record.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := res.Batches[0].Records.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(t, recs[0]); got != "smile 😀 \\ud800 is text" {
		t.Fatalf("stored %q", got)
	}
}

// Text is stored without HTML escaping: '<' stays one byte, so a body
// within the documented limit is stored, and reads back as sent.
func TestDeliverStoresTextUnescaped(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.MaxBody = transport.DefaultMaxBody })
	ctx := testCtx(t)
	status, _, b := e.postJSON(t, "/agents/echo/html", "{\"message\":\"<b>fish & chips</b>\",\"uid\":\"a<b\",\"initialData\":{\"sep\":\"x\u2028y\"}}", nil)
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, b)
	}
	status, _, page := e.do(t, http.MethodGet, "/agents/echo/html/conversation", nil, nil)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, page)
	}
	if !bytes.Contains(page, []byte(`"text":"<b>fish & chips</b>"`)) || !bytes.Contains(page, []byte(`"uid":"a<b"`)) ||
		!bytes.Contains(page, []byte("\"sep\":\"x\u2028y\"")) {
		t.Fatalf("stored escaped: %s", page)
	}

	// 8,000,000 bytes, nearly all '<': six times that once HTML-escaped,
	// far over the log's batch limit.
	body := `{"message":"` + strings.Repeat("<", 8_000_000-len(`{"message":""}`)) + `"}`
	if len(body) != 8_000_000 {
		t.Fatal(len(body))
	}
	status, _, b = e.postJSON(t, "/agents/echo/big", body, nil)
	if status != http.StatusAccepted {
		if len(b) > 300 {
			b = b[:300]
		}
		t.Fatalf("an 8,000,000-byte body under the %d-byte limit: status %d: %s", transport.DefaultMaxBody, status, b)
	}
	res, err := e.c.Read(ctx, "echo", "big", "", record.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Batches[0].Records); n > 8_000_000+1024 {
		t.Fatalf("stored %d bytes for an 8,000,000-byte body", n)
	}
}

// A POST's session is the body's field; ?session= on it is refused, not
// ignored (the message would go to "default" while its sender reads s9).
func TestDeliverRefusesSessionQuery(t *testing.T) {
	e := newEnv(t)
	for _, path := range []string{"/agents/echo/i1?session=s9", "/agents/echo/i1?session=default", "/agents/echo/i1?session="} {
		status, _, b := e.postJSON(t, path, `{"message":"hi","session":"s9"}`, nil)
		if status != http.StatusBadRequest {
			t.Fatalf("%s: status %d: %s", path, status, b)
		}
		eb := errorOf(t, b)
		if eb["code"] != wire.CodeBadRequest || !strings.Contains(eb["message"].(string), `"session" field`) {
			t.Fatalf("%s: %s", path, b)
		}
	}
	if e.admitted.Load() != 0 {
		t.Fatal("admitted")
	}
	// Other query parameters are still ignored, as before.
	if status, _, b := e.postJSON(t, "/agents/echo/i1?trace=1", `{"message":"hi","session":"s9"}`, nil); status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, b)
	}
}

// An abort that loses the race to completion (the turn settled completed
// before the cancellation reached it) answers 409 already_settled, as an
// abort of a submission already settled does, not 200 "completed".
func TestAbortLosingTheRace(t *testing.T) {
	var db *log.DB
	e := newEnv(t, func(o *envConfig) {
		o.Abort = func(ctx context.Context, id string) (record.Submission, error) {
			// The turn completes while the abort is on its way, as
			// worker.Pool.Abort sees it when the cancellation comes late.
			sub, err := db.Submission(ctx, id)
			if err != nil {
				return record.Submission{}, err
			}
			if _, err := db.Write(ctx, log.Write{Key: sub.Key, Settle: []record.Settlement{{SubmissionID: id, Outcome: record.OutcomeCompleted}}}); err != nil {
				return record.Submission{}, err
			}
			return db.Submission(ctx, id)
		}
	})
	db = e.db
	status, _, b := e.postJSON(t, "/agents/echo/race", `{"message":"hi"}`, nil)
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, b)
	}
	var acc wire.Accepted
	if err := json.Unmarshal(b, &acc); err != nil {
		t.Fatal(err)
	}
	status, _, b = e.do(t, http.MethodPost, "/agents/echo/race/submissions/"+acc.SubmissionID+"/abort", nil, nil)
	if status != http.StatusConflict || errorOf(t, b)["code"] != wire.CodeAlreadySettled {
		t.Fatalf("abort that lost the race: status %d: %s", status, b)
	}
	sub, err := e.c.Submission(testCtx(t), "echo", "race", acc.SubmissionID, 0)
	if err != nil || sub.Status != record.StatusCompleted {
		t.Fatalf("submission %+v %v", sub, err)
	}
}
