package transport_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

func TestConversationPaging(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	key := record.Key{Agent: "echo", Instance: "i1", Session: "default"}

	// An absent stream reads as empty, not 404.
	status, _, b := e.do(t, "GET", "/agents/echo/i1/conversation", nil, nil)
	if status != 200 || string(b) != `{"incarnation":null,"batches":[],"nextOffset":"0","upToDate":true}` {
		t.Fatalf("absent stream: %d %s", status, b)
	}

	var want []string
	for i := 0; i < 7; i++ {
		texts := []string{string(rune('a' + i))}
		recs := []record.Record{userText(texts[0])}
		if i%3 == 0 { // some batches of two
			texts = append(texts, texts[0]+"'")
			recs = append(recs, assistantText(texts[1]))
		}
		if _, err := e.db.Append(ctx, key, recs...); err != nil {
			t.Fatal(err)
		}
		want = append(want, texts...)
	}

	var got []string
	offset, pages := record.Start, 0
	var inc record.Incarnation
	for {
		res, err := e.c.Read(ctx, "echo", "i1", "", offset, 2)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if inc == "" {
			inc = res.Incarnation
		} else if res.Incarnation != inc {
			t.Fatalf("incarnation changed %s -> %s", inc, res.Incarnation)
		}
		if len(res.Batches) == 0 {
			t.Fatalf("empty page at %s: %+v", offset, res)
		}
		if res.Batches[0].Offset != offset {
			t.Fatalf("page at %s starts at %s", offset, res.Batches[0].Offset)
		}
		for _, bt := range res.Batches {
			recs, err := bt.Records.Decode()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				got = append(got, textOf(t, r))
			}
		}
		offset = res.NextOffset
		if res.UpToDate {
			break
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("read %v, want %v", got, want)
	}
	if pages < 4 {
		t.Errorf("%d pages with limit 2: limit ignored?", pages)
	}
	// At the tail: an empty up-to-date page at the same offset.
	res, err := e.c.Read(ctx, "echo", "i1", "default", offset, 0)
	if err != nil || len(res.Batches) != 0 || !res.UpToDate || res.NextOffset != offset {
		t.Fatalf("tail read %+v %v", res, err)
	}

	// The wire form, against the golden file: the first two batches.
	status, h, b := e.do(t, "GET", "/agents/echo/i1/conversation?session=default&offset=0&limit=3", nil, nil)
	if status != 200 || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		t.Fatalf("%d %s", status, b)
	}
	if !json.Valid(b) {
		t.Fatalf("invalid JSON: %s", b)
	}
	golden(t, "conversation_page.json", b)
}

func TestConversationErrors(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	key := record.Key{Agent: "echo", Instance: "i1", Session: "default"}
	ap, err := e.db.Append(ctx, key, userText("one"), userText("two"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		query  string
		path   string
		status int
		code   string
	}{
		{query: "offset=abc", status: 400, code: "invalid_offset"},
		{query: "offset=", status: 400, code: "invalid_offset"},
		{query: "offset=-1", status: 400, code: "invalid_offset"},
		{query: "offset=01", status: 400, code: "invalid_offset"},
		{query: "offset=99999999999999999999999", status: 400, code: "invalid_offset"},
		{query: "offset=1", status: 400, code: "unknown_offset"},  // inside a batch
		{query: "offset=50", status: 400, code: "unknown_offset"}, // past the tail
		{query: "limit=0", status: 400, code: "invalid_limit"},
		{query: "limit=10001", status: 400, code: "invalid_limit"},
		{query: "limit=ten", status: 400, code: "invalid_limit"},
		{query: "limit=", status: 400, code: "invalid_limit"},
		{query: "session=bad%20name", status: 400, code: "invalid_name"},
		{query: "session=", status: 400, code: "invalid_name"},
		{path: "/agents/ghost/i1/conversation", status: 404, code: "not_found"},
		{path: "/agents/echo/.dot/conversation", status: 400, code: "invalid_name"},
	}
	for _, tc := range cases {
		path := tc.path
		if path == "" {
			path = "/agents/echo/i1/conversation?" + tc.query
		}
		status, _, b := e.do(t, "GET", path, nil, nil)
		if status != tc.status {
			t.Errorf("%s: %d, want %d: %s", path, status, tc.status, b)
			continue
		}
		eb := errorOf(t, b)
		if eb["code"] != tc.code {
			t.Errorf("%s: code %v, want %s", path, eb["code"], tc.code)
		}
		if tc.code == "unknown_offset" && eb["incarnation"] != string(ap.Incarnation) {
			t.Errorf("%s: incarnation %v, want %s", path, eb["incarnation"], ap.Incarnation)
		}
		if _, has := eb["incarnation"]; has != (tc.code == "unknown_offset") {
			t.Errorf("%s: incarnation present=%v", path, has)
		}
	}

	// An offset of an absent stream other than 0: unknown, incarnation null.
	status, _, b := e.do(t, "GET", "/agents/echo/fresh/conversation?offset=3", nil, nil)
	eb := errorOf(t, b)
	if v, has := eb["incarnation"]; status != 400 || eb["code"] != "unknown_offset" || !has || v != nil {
		t.Errorf("absent stream: %d %s", status, b)
	}

	// After a reset, the old offset is unknown and the error names the new
	// incarnation: the client's cue to restart from 0.
	inc, err := e.db.Reset(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Read(ctx, "echo", "i1", "", ap.NextOffset, 0)
	var ae *wire.APIError
	if !asAPIError(err, &ae) || ae.Status != http.StatusBadRequest || ae.Code != wire.CodeUnknownOffset || ae.Incarnation != inc || inc == ap.Incarnation {
		t.Fatalf("after reset: %#v (new incarnation %s)", err, inc)
	}
	golden(t, "error_unknown_offset.json", mustGet(t, e, "/agents/echo/i1/conversation?offset="+string(ap.NextOffset)))
}

func mustGet(t *testing.T, e *env, path string) []byte {
	t.Helper()
	_, _, b := e.do(t, "GET", path, nil, nil)
	return b
}
