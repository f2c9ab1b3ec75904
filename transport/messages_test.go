package transport_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

type messagesBody struct {
	Type        string              `json:"type"`
	Incarnation *record.Incarnation `json:"incarnation"`
	Messages    []struct {
		Role  string `json:"role"`
		Parts []struct {
			Text string `json:"text"`
		} `json:"parts"`
	} `json:"messages"`
	Settlements []record.Settlement `json:"settlements"`
	NextOffset  record.Offset       `json:"nextOffset"`
}

func TestMessagesJSON(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	key := record.Key{Agent: "echo", Instance: "view", Session: "s"}
	status, _, body := e.do(t, http.MethodGet, "/agents/echo/view/messages?session=s", nil, nil)
	var v messagesBody
	if status != http.StatusOK || json.Unmarshal(body, &v) != nil || v.Incarnation != nil || len(v.Messages) != 0 || v.NextOffset != record.Start || v.Settlements == nil {
		t.Fatalf("absent stream: %d %s", status, body)
	}
	a1, err := e.db.Append(ctx, key, userText("question"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := e.db.Append(ctx, key, assistantText("answer"))
	if err != nil {
		t.Fatal(err)
	}
	status, _, body = e.do(t, http.MethodGet, "/agents/echo/view/messages?session=s", nil, nil)
	v = messagesBody{}
	if status != http.StatusOK || json.Unmarshal(body, &v) != nil || len(v.Messages) != 2 || v.Messages[1].Parts[0].Text != "answer" ||
		v.NextOffset != a2.NextOffset || *v.Incarnation != a1.Incarnation {
		t.Fatalf("view: %d %s", status, body)
	}
	// offset ends the view: before the answer's batch.
	status, _, body = e.do(t, http.MethodGet, "/agents/echo/view/messages?session=s&offset="+string(a2.Offset), nil, nil)
	v = messagesBody{}
	if status != http.StatusOK || json.Unmarshal(body, &v) != nil || len(v.Messages) != 1 || v.NextOffset != a2.Offset {
		t.Fatalf("view up to %s: %d %s", a2.Offset, status, body)
	}
	status, _, body = e.do(t, http.MethodGet, "/agents/echo/view/messages?session=s&offset=99", nil, nil)
	if status != http.StatusBadRequest || errorOf(t, body)["code"] != wire.CodeUnknownOffset {
		t.Fatalf("unknown offset: %d %s", status, body)
	}
}

func openMessages(t *testing.T, e *env, query, lastID string) *client.StreamReader {
	t.Helper()
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, e.ts.URL+"/agents/echo/view/messages"+query, nil)
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("messages stream: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	sr := client.NewStreamReader(resp.Body)
	t.Cleanup(func() { sr.Close() })
	return sr
}

func nextView(t *testing.T, sr *client.StreamReader) (messagesBody, string) {
	t.Helper()
	for {
		f := nextData(t, sr)
		if f.Type != transport.FrameMessages {
			continue // a presentation frame
		}
		var v messagesBody
		if err := json.Unmarshal(f.Raw, &v); err != nil {
			t.Fatal(err)
		}
		inc := ""
		if v.Incarnation != nil {
			inc = string(*v.Incarnation)
		}
		if f.ID != string(v.NextOffset)+"/"+inc {
			t.Fatalf("frame id %q, nextOffset %q, incarnation %q", f.ID, v.NextOffset, inc)
		}
		return v, f.ID
	}
}

// TestMessagesSSE: a full view at once, then after each change; a reset
// is just a view with the new incarnation; a resume at the tail waits for
// the next change.
func TestMessagesSSE(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	key := record.Key{Agent: "echo", Instance: "view", Session: record.DefaultSession}
	if _, err := e.db.Append(ctx, key, userText("one")); err != nil {
		t.Fatal(err)
	}
	sr := openMessages(t, e, "", "")
	v, _ := nextView(t, sr)
	if len(v.Messages) != 1 || v.Messages[0].Parts[0].Text != "one" {
		t.Fatalf("first view %+v", v)
	}
	if _, err := e.db.Append(ctx, key, assistantText("two")); err != nil {
		t.Fatal(err)
	}
	v, id := nextView(t, sr)
	if len(v.Messages) != 2 {
		t.Fatalf("second view %+v", v)
	}
	old := *v.Incarnation

	// A reader resuming at the tail gets nothing until the next change.
	resumed := openMessages(t, e, "", id)
	if _, err := e.db.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Append(ctx, key, userText("fresh")); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*client.StreamReader{sr, resumed} {
		// The reset alone may come as its own empty view first.
		for i := 0; ; i++ {
			v, _ = nextView(t, r)
			if len(v.Messages) == 1 && v.Messages[0].Parts[0].Text == "fresh" {
				break
			}
			if i == 2 || len(v.Messages) != 0 {
				t.Fatalf("after reset: %+v", v)
			}
		}
		if *v.Incarnation == old {
			t.Fatalf("after reset, still incarnation %s", old)
		}
	}
}

// TestMessagesViewTooLarge: the server projects at most MaxViewRecords
// records for one view, and says so instead of holding more.
func TestMessagesViewTooLarge(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	key := record.Key{Agent: "echo", Instance: "huge", Session: record.DefaultSession}
	batch := make([]record.Record, 1000)
	for written := 0; written <= transport.MaxViewRecords; written += len(batch) {
		for i := range batch {
			batch[i] = userText("x")
		}
		if _, err := e.db.Append(ctx, key, batch...); err != nil {
			t.Fatal(err)
		}
	}
	status, _, body := e.do(t, http.MethodGet, "/agents/echo/huge/messages", nil, nil)
	if status != http.StatusUnprocessableEntity || errorOf(t, body)["code"] != transport.CodeViewTooLarge {
		t.Fatalf("a view of more than %d records: %d %.200s", transport.MaxViewRecords, status, body)
	}
}

// TestMessagesSSEResumeAcrossIncarnations: a frame id names its view's
// incarnation, so a reader resuming with the id of a replaced stream gets
// the current view at once, even at the same offset; one resuming with a
// current id gets nothing until the next change.
func TestMessagesSSEResumeAcrossIncarnations(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	key := record.Key{Agent: "echo", Instance: "view", Session: record.DefaultSession}
	old, err := e.db.Append(ctx, key, userText("before"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	cur, err := e.db.Append(ctx, key, userText("after"))
	if err != nil {
		t.Fatal(err)
	}
	if old.NextOffset != cur.NextOffset {
		t.Fatalf("the test wants the same offset in both: %s and %s", old.NextOffset, cur.NextOffset)
	}
	stale := openMessages(t, e, "", string(old.NextOffset)+"/"+string(old.Incarnation))
	v, _ := nextView(t, stale)
	if *v.Incarnation != cur.Incarnation || len(v.Messages) != 1 || v.Messages[0].Parts[0].Text != "after" {
		t.Fatalf("resumed with a replaced stream's id: %+v", v)
	}
	current := openMessages(t, e, "", string(cur.NextOffset)+"/"+string(cur.Incarnation))
	if _, err := e.db.Append(ctx, key, assistantText("next")); err != nil {
		t.Fatal(err)
	}
	v, _ = nextView(t, current)
	if len(v.Messages) != 2 {
		t.Fatalf("resumed with a current id, the first frame is %+v; want the change after it", v)
	}
}

// A view is capped in bytes (MaxViewBytes), as JSON and as an SSE frame:
// each SSE reader holds its frame until its client takes it, so without a
// cap 30 readers of a 4.3 MB view that never read took a gigabyte.
func TestMessagesViewBytesCap(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.MaxViewBytes = 4 << 10 })
	key := record.Key{Agent: "echo", Instance: "big", Session: "default"}
	if _, err := e.db.Write(context.Background(), log.Write{Key: key, Records: []record.Record{userText(strings.Repeat("x", 8<<10))}}); err != nil {
		t.Fatal(err)
	}
	status, _, body := e.do(t, http.MethodGet, "/agents/echo/big/messages", nil, nil)
	if status != http.StatusUnprocessableEntity || errorOf(t, body)["code"] != transport.CodeViewTooLarge {
		t.Errorf("JSON: %d %s", status, body)
	}
	lb := openLive(t, e, http.MethodGet, "/agents/echo/big/messages", "", map[string]string{"Accept": "text/event-stream"})
	if got := lb.end(t); !strings.Contains(got, `"error"`) || !strings.Contains(got, transport.CodeViewTooLarge) {
		t.Errorf("SSE: %s", got)
	}
	// A small view passes.
	if status, _, body := e.do(t, http.MethodGet, "/agents/echo/small/messages", nil, nil); status != http.StatusOK {
		t.Errorf("small view: %d %s", status, body)
	}
}
