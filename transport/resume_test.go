package transport_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/convlog/convlog/log/record"
)

// A client that follows the streaming protocol literally ("reconnect with
// the last offset you received in a conversation frame") and sees only
// the frames' JSON, not the SSE ids: it reconnects after every frame with
// the frame's "offset" (or "nextOffset"), and must get every record once.
func TestStreamResumeFromFrameJSON(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	var want []string
	for i := range 6 {
		recs := []record.Record{userText(fmt.Sprintf("u%d", i))}
		want = append(want, fmt.Sprintf("u%d", i))
		if i%2 == 1 { // batches of one and of two records
			recs = append(recs, assistantText(fmt.Sprintf("a%d", i)))
			want = append(want, fmt.Sprintf("a%d", i))
		}
		if _, err := e.db.Append(ctx, streamKey, recs...); err != nil {
			t.Fatal(err)
		}
	}
	for _, field := range []string{"offset", "nextOffset"} {
		t.Run(field, func(t *testing.T) {
			var got []string
			offset := "0"
			for len(got) < len(want) {
				frame := firstConversationJSON(ctx, t, e.ts.Client(), e.ts.URL+"/agents/echo/i1/stream?offset="+url.QueryEscape(offset))
				var f struct {
					Records []record.Record `json:"records"`
				}
				if err := json.Unmarshal(frame, &f); err != nil {
					t.Fatal(err)
				}
				for _, r := range f.Records {
					got = append(got, textOf(t, r))
				}
				var fields map[string]any
				if err := json.Unmarshal(frame, &fields); err != nil {
					t.Fatal(err)
				}
				next, _ := fields[field].(string)
				if next == "" || next == offset {
					t.Fatalf("frame %s: no progress in %q", frame, field)
				}
				offset = next
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("resuming from each frame's %q read %v, want %v", field, got, want)
			}
		})
	}
}

// firstConversationJSON opens a stream, returns the data of its first
// conversation frame and closes it. It parses SSE by hand and ignores ids.
func firstConversationJSON(ctx context.Context, t *testing.T, hc *http.Client, u string) []byte {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var head struct {
			Type string `json:"type"`
		}
		if json.Unmarshal([]byte(data), &head) == nil && head.Type == "conversation" {
			return []byte(data)
		}
	}
	t.Fatalf("stream ended without a conversation frame: %v", sc.Err())
	return nil
}
