package transport_test

import (
	"context"
	"fmt"
	"iter"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
)

var followKey = record.Key{Agent: "echo", Instance: "f1", Session: record.DefaultSession}

// nextUpdate pulls updates until one of kind arrives (others are returned
// in skipped).
func nextUpdate(t *testing.T, next func() (client.Update, error, bool), kind client.UpdateKind) (u client.Update, skipped []client.Update) {
	t.Helper()
	for {
		u, err, ok := next()
		if !ok {
			t.Fatalf("follow ended waiting for %s; saw %v", kind, skipped)
		}
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		if u.Kind == kind {
			return u, skipped
		}
		skipped = append(skipped, u)
	}
}

func pull(t *testing.T, seq iter.Seq2[client.Update, error]) func() (client.Update, error, bool) {
	next, stop := iter.Pull2(seq)
	t.Cleanup(stop)
	return next
}

func batchText(t *testing.T, u client.Update) string {
	t.Helper()
	return textOf(t, u.Records[0])
}

// TestFollowIncarnationChangeRereadsFromZero: a reset under a connected
// reader yields UpdateReset and the new incarnation from "0", by SSE and by
// polling.
func TestFollowIncarnationChangeRereadsFromZero(t *testing.T) {
	for _, live := range []client.Live{client.LiveSSE, client.LivePoll} {
		t.Run(string(live), func(t *testing.T) {
			e := newEnv(t)
			ctx := testCtx(t)
			key := followKey
			key.Instance = "f-" + string(live)
			if _, err := e.db.Append(ctx, key, userText("old one")); err != nil {
				t.Fatal(err)
			}
			next := pull(t, e.c.Follow(ctx, key.Agent, key.Instance, client.FollowOptions{Live: live, PollInterval: 10 * time.Millisecond}))
			u, _ := nextUpdate(t, next, client.UpdateBatch)
			if batchText(t, u) != "old one" {
				t.Fatalf("first batch %q", batchText(t, u))
			}
			old := u.Incarnation
			if _, err := e.db.Reset(ctx, key); err != nil {
				t.Fatal(err)
			}
			if _, err := e.db.Append(ctx, key, userText("new one")); err != nil {
				t.Fatal(err)
			}
			r, _ := nextUpdate(t, next, client.UpdateReset)
			if r.Incarnation == old {
				t.Fatalf("reset to the same incarnation %q", old)
			}
			u, skipped := nextUpdate(t, next, client.UpdateBatch)
			if u.Offset != record.Start || batchText(t, u) != "new one" || u.Incarnation == old {
				t.Fatalf("after reset: %+v (skipped %v)", u, skipped)
			}
		})
	}
}

// TestFollowReconnectsAfterIdleTimeout: a stream silent for the idle
// timeout (no keepalive either) is dropped and reopened from the last
// offset; what is written later arrives once.
func TestFollowReconnectsAfterIdleTimeout(t *testing.T) {
	e := newEnv(t, func(o *envConfig) { o.Heartbeat = time.Hour })
	ctx := testCtx(t)
	if _, err := e.db.Append(ctx, followKey, userText("one")); err != nil {
		t.Fatal(err)
	}
	next := pull(t, e.c.Follow(ctx, followKey.Agent, followKey.Instance, client.FollowOptions{Live: client.LiveSSE, IdleTimeout: 150 * time.Millisecond}))
	first, _ := nextUpdate(t, next, client.UpdateBatch)
	rec, _ := nextUpdate(t, next, client.UpdateReconnecting)
	if rec.Err == nil || !strings.Contains(rec.Err.Error(), "silent") || rec.NextOffset != first.NextOffset {
		t.Fatalf("reconnecting: %+v", rec)
	}
	if _, err := e.db.Append(ctx, followKey, userText("two")); err != nil {
		t.Fatal(err)
	}
	u, skipped := nextUpdate(t, next, client.UpdateBatch)
	if batchText(t, u) != "two" || u.Offset != first.NextOffset {
		t.Fatalf("after the reconnection: %q at %s (skipped %v)", batchText(t, u), u.Offset, skipped)
	}
}

// TestFollowFallsBackToPolling: behind a proxy that answers the stream
// route with an HTML page, LiveAuto switches to polling and loses nothing.
func TestFollowFallsBackToPolling(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	h := e.srv.Handler()
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stream") {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<html>no streaming here</html>"))
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	c := &client.Client{BaseURL: proxy.URL, HTTP: proxy.Client()}
	if _, err := e.db.Append(ctx, followKey, userText("one")); err != nil {
		t.Fatal(err)
	}
	next := pull(t, c.Follow(ctx, followKey.Agent, followKey.Instance, client.FollowOptions{PollInterval: 10 * time.Millisecond}))
	p, _ := nextUpdate(t, next, client.UpdatePolling)
	if p.Err == nil {
		t.Fatal("polling without a reason")
	}
	u, _ := nextUpdate(t, next, client.UpdateBatch)
	if batchText(t, u) != "one" {
		t.Fatalf("first batch %q", batchText(t, u))
	}
	if _, err := e.db.Append(ctx, followKey, userText("two")); err != nil {
		t.Fatal(err)
	}
	u, _ = nextUpdate(t, next, client.UpdateBatch)
	if batchText(t, u) != "two" {
		t.Fatalf("second batch %q", batchText(t, u))
	}
}

// TestConversationProjectsAndTruncates: the iterator of projected state
// applies a truncation that hides the last message.
func TestConversationProjectsAndTruncates(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	a, err := e.db.Append(ctx, followKey, userText("question"), assistantText("answer"))
	if err != nil {
		t.Fatal(err)
	}
	var sawTwo bool
	for st, err := range e.c.Conversation(ctx, followKey.Agent, followKey.Instance, client.FollowOptions{Live: client.LiveSSE}) {
		if err != nil {
			t.Fatal(err)
		}
		switch len(st.Messages) {
		case 2:
			sawTwo = true
			if _, err := e.db.Append(ctx, followKey, record.TruncatedRecord(a.Records[0].Entry.ID, "regenerate")); err != nil {
				t.Fatal(err)
			}
			continue
		case 1:
			if !sawTwo {
				t.Fatalf("one message before two: %+v", st.Messages)
			}
			if st.Messages[0].Role != "user" || st.Incarnation != a.Incarnation {
				t.Fatalf("after truncation: %+v", st)
			}
		default:
			t.Fatalf("view %+v", st.View)
		}
		break
	}
	if !sawTwo {
		t.Fatal("the iterator ended early")
	}
}

// TestFollowRetriesSSEAfterBadGateway: a proxy's 502 while the server
// restarts is a passing failure: LiveAuto retries SSE, it does not fall
// back to polling for good.
func TestFollowRetriesSSEAfterBadGateway(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	h := e.srv.Handler()
	var refused atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stream") && refused.Add(1) <= 3 {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	c := &client.Client{BaseURL: proxy.URL, HTTP: proxy.Client()}
	if _, err := e.db.Append(ctx, followKey, userText("one")); err != nil {
		t.Fatal(err)
	}
	next := pull(t, c.Follow(ctx, followKey.Agent, followKey.Instance, client.FollowOptions{RetryMax: 20 * time.Millisecond}))
	u, skipped := nextUpdate(t, next, client.UpdateBatch)
	if batchText(t, u) != "one" || len(skipped) != 3 {
		t.Fatalf("first batch %q after %v", batchText(t, u), skipped)
	}
	for _, s := range skipped {
		if s.Kind != client.UpdateReconnecting {
			t.Fatalf("before the first batch: %v", skipped)
		}
	}
}

// TestFollowResumesOnlyInItsIncarnation: a reader resuming from a saved
// offset and incarnation, after the stream was replaced by one where that
// offset exists too (a reset and new writes; a restore), starts over
// instead of taking the new records for the ones it knew.
func TestFollowResumesOnlyInItsIncarnation(t *testing.T) {
	for _, tc := range []struct {
		live  client.Live
		texts []string // written in the new incarnation
	}{
		{client.LiveSSE, []string{"new 1", "new 2"}},
		{client.LivePoll, []string{"new 1", "new 2"}},
		// The saved offset is the new tail: no batch comes to say so.
		{client.LiveSSE, []string{"new 1"}},
		{client.LivePoll, []string{"new 1"}},
	} {
		live := tc.live
		t.Run(fmt.Sprintf("%s/%d", live, len(tc.texts)), func(t *testing.T) {
			e := newEnv(t)
			ctx := testCtx(t)
			key := followKey
			key.Instance = fmt.Sprintf("saved-%s-%d", live, len(tc.texts))
			saved, err := e.db.Append(ctx, key, userText("old"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.db.Reset(ctx, key); err != nil {
				t.Fatal(err)
			}
			for _, text := range tc.texts {
				if _, err := e.db.Append(ctx, key, userText(text)); err != nil {
					t.Fatal(err)
				}
			}
			next := pull(t, e.c.Follow(ctx, key.Agent, key.Instance, client.FollowOptions{Live: live, PollInterval: 10 * time.Millisecond,
				Offset: saved.NextOffset, Incarnation: saved.Incarnation}))
			if u, err, _ := next(); err != nil || u.Kind != client.UpdateReset || u.Incarnation == saved.Incarnation {
				t.Fatalf("first update %+v %v, want a reset", u, err)
			}
			u, _ := nextUpdate(t, next, client.UpdateBatch)
			if u.Offset != record.Start || batchText(t, u) != "new 1" {
				t.Fatalf("after the reset: %q at %s", batchText(t, u), u.Offset)
			}
		})
	}
}
