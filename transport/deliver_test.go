package transport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

func TestDeliverAccepted(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	// Something before, so that the offset is not trivially 0.
	if _, err := e.db.Append(ctx, record.Key{Agent: "echo", Instance: "i1", Session: "s-1"}, assistantText("earlier")); err != nil {
		t.Fatal(err)
	}
	body := `{"message":{"kind":"user","body":"Summarize the open issues.","purpose":"dispatch","display":"hidden","metadata":{"trace":"t1"}},"session":"s-1","initialData":{"plan":"pro"},"uid":"gen-7"}`
	status, h, b := e.postJSON(t, "/agents/echo/i1", body, nil)
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, b)
	}
	golden(t, "accepted.json", b)

	var acc map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&acc); err != nil {
		t.Fatal(err)
	}
	if len(acc) != 6 || acc["uid"] != "gen-7" {
		t.Fatalf("202 body has fields %v, want exactly submissionId, streamUrl, conversationUrl, updatesUrl, offset, uid", acc)
	}
	sub, off := acc["submissionId"].(string), acc["offset"].(string)
	if !strings.HasPrefix(sub, "sub_") || off != "1" {
		t.Fatalf("body %s", b)
	}
	if got, want := h.Get("Location"), "/agents/echo/i1/submissions/"+sub; got != want {
		t.Errorf("Location %q, want %q", got, want)
	}
	for field, want := range map[string]string{
		"conversationUrl": "/agents/echo/i1/conversation?session=s-1&offset=1",
		"streamUrl":       "/agents/echo/i1/conversation?session=s-1&offset=1",
		"updatesUrl":      "/agents/echo/i1/stream?session=s-1&offset=1",
	} {
		if acc[field] != want {
			t.Errorf("%s = %v, want %s", field, acc[field], want)
		}
	}
	if e.admitted.Load() != 1 {
		t.Errorf("Admitted called %d times", e.admitted.Load())
	}

	// Reading from the returned offset starts with this very message.
	res, err := e.c.Read(ctx, "echo", "i1", "s-1", record.Offset(off), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Batches) != 1 || res.Batches[0].Offset != record.Offset(off) {
		t.Fatalf("read %+v", res)
	}
	recs, err := res.Batches[0].Records.Decode()
	if err != nil {
		t.Fatal(err)
	}
	en := recs[0].Entry
	if en.Type != record.EntryUserMessage || en.SubmissionID != sub {
		t.Fatalf("first record %+v", en)
	}
	var p record.MessagePayload
	if err := json.Unmarshal(en.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if p.Purpose != "dispatch" || p.Display != "hidden" || len(p.Parts) != 1 || p.Parts[0].Text != "Summarize the open issues." {
		t.Fatalf("payload %s", en.Payload)
	}
	if got, want := string(p.Metadata), `{"initialData":{"plan":"pro"},"trace":"t1","uid":"gen-7"}`; got != want {
		t.Errorf("metadata %s, want %s", got, want)
	}

	// The submission route knows it.
	s, err := e.c.Submission(ctx, "echo", "i1", sub, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != record.StatusAdmitted || s.Offset != record.Offset(off) {
		t.Fatalf("submission %+v", s)
	}
}

func TestDeliverForms(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	cases := []struct {
		name, body string
		want       []record.Part
	}{
		{"bare string", `{"message":"hi"}`, []record.Part{{Type: "text", Text: "hi"}}},
		{"body then parts", `{"message":{"kind":"user","body":"look","parts":[{"type":"file","mediaType":"image/png","url":"data:image/png;base64,AAAA","filename":"a.png"},{"type":"data","name":"form","data":{"x":1}}]}}`,
			[]record.Part{{Type: "text", Text: "look"}, {Type: "file", MediaType: "image/png", URL: "data:image/png;base64,AAAA", Filename: "a.png"}, {Type: "data", Name: "form", Data: json.RawMessage(`{"x":1}`)}}},
		{"parts only", `{"message":{"kind":"user","parts":[{"type":"text","text":"only"}]}}`, []record.Part{{Type: "text", Text: "only"}}},
		{"charset", `{"message":"utf8 ✓"}`, []record.Part{{Type: "text", Text: "utf8 ✓"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{}
			if tc.name == "charset" {
				h["Content-Type"] = "application/json; charset=UTF-8"
			}
			status, _, b := e.postJSON(t, "/agents/echo/forms", tc.body, h)
			if status != http.StatusAccepted {
				t.Fatalf("status %d: %s", status, b)
			}
			var acc wire.Accepted
			if err := json.Unmarshal(b, &acc); err != nil {
				t.Fatal(err)
			}
			res, err := e.c.Read(ctx, "echo", "forms", "", acc.Offset, 1)
			if err != nil {
				t.Fatal(err)
			}
			recs, _ := res.Batches[0].Records.Decode()
			var p record.MessagePayload
			if err := json.Unmarshal(recs[0].Entry.Payload, &p); err != nil {
				t.Fatal(err)
			}
			gb, _ := json.Marshal(p.Parts)
			wb, _ := json.Marshal(tc.want)
			if !bytes.Equal(gb, wb) {
				t.Fatalf("parts %s, want %s", gb, wb)
			}
		})
	}
}

func TestDeliverErrors(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	// "strict" rejects while busy: give its session a pending submission.
	if _, err := e.c.Deliver(ctx, "strict", "i1", wire.DeliverRequest{Message: wire.Message{Body: "first"}}, ""); err != nil {
		t.Fatal(err)
	}
	big := `{"message":"` + strings.Repeat("x", 70<<10) + `"}`
	cases := []struct {
		name    string
		path    string
		ct      string // "" means application/json; "-" means none
		body    io.Reader
		header  map[string]string
		status  int
		code    string
		message string // a substring of the message
	}{
		{name: "bad json", body: strings.NewReader(`{"message":`), status: 400, code: "bad_request", message: "invalid JSON"},
		{name: "syntax", body: strings.NewReader(`{"message" "x"}`), status: 400, code: "bad_request", message: "invalid JSON at byte"},
		{name: "empty body", body: strings.NewReader(``), status: 400, code: "bad_request", message: "empty"},
		{name: "not an object", body: strings.NewReader(`["hi"]`), status: 400, code: "bad_request", message: "must be a JSON object"},
		{name: "trailing data", body: strings.NewReader(`{"message":"hi"} {}`), status: 400, code: "bad_request", message: "after the JSON value"},
		{name: "unknown field", body: strings.NewReader(`{"message":"hi","colour":"red"}`), status: 400, code: "bad_request", message: `unknown field "colour"`},
		{name: "unknown message field", body: strings.NewReader(`{"message":{"kind":"user","body":"hi","role":"x"}}`), status: 400, code: "bad_request", message: `unknown field "role" in "message"`},
		{name: "unknown part field", body: strings.NewReader(`{"message":{"kind":"user","parts":[{"type":"text","text":"a","size":1}]}}`), status: 400, code: "bad_request", message: `unknown field "size" in "message"`},
		{name: "message missing", body: strings.NewReader(`{"session":"s"}`), status: 400, code: "bad_request", message: `"message" is required`},
		{name: "message null", body: strings.NewReader(`{"message":null}`), status: 400, code: "bad_request", message: `"message" is required`},
		{name: "empty string", body: strings.NewReader(`{"message":""}`), status: 400, code: "bad_request", message: `"message" is empty`},
		{name: "blank string", body: strings.NewReader(`{"message":"  \n"}`), status: 400, code: "bad_request", message: `"message" is empty`},
		{name: "empty body text", body: strings.NewReader(`{"message":{"kind":"user","body":""}}`), status: 400, code: "bad_request", message: `"message.body" is empty`},
		{name: "no content", body: strings.NewReader(`{"message":{"kind":"user"}}`), status: 400, code: "bad_request", message: `needs a "body" or at least one part`},
		{name: "message number", body: strings.NewReader(`{"message":42}`), status: 400, code: "bad_request", message: "string or an object"},
		{name: "kind missing", body: strings.NewReader(`{"message":{"body":"hi"}}`), status: 400, code: "bad_request", message: `"message.kind" is required`},
		{name: "wrong kind", body: strings.NewReader(`{"message":{"kind":"assistant","body":"hi"}}`), status: 400, code: "bad_request", message: `must be "user", not "assistant"`},
		{name: "wrong body type", body: strings.NewReader(`{"message":{"kind":"user","body":7}}`), status: 400, code: "bad_request", message: `"message.body" must not be number`},
		{name: "bad purpose", body: strings.NewReader(`{"message":{"kind":"user","body":"hi","purpose":"assistant"}}`), status: 400, code: "bad_request", message: "message.purpose"},
		{name: "bad display", body: strings.NewReader(`{"message":{"kind":"user","body":"hi","display":"loud"}}`), status: 400, code: "bad_request", message: "message.display"},
		{name: "metadata not object", body: strings.NewReader(`{"message":{"kind":"user","body":"hi","metadata":[1]}}`), status: 400, code: "bad_request", message: "must be an object"},
		{name: "tool-call part", body: strings.NewReader(`{"message":{"kind":"user","parts":[{"type":"tool-call","toolCallId":"c1","toolName":"x"}]}}`), status: 400, code: "bad_request", message: `parts[0]": type "tool-call" is not accepted`},
		{name: "empty text part", body: strings.NewReader(`{"message":{"kind":"user","parts":[{"type":"text","text":""}]}}`), status: 400, code: "bad_request", message: "non-empty"},
		{name: "foreign field in part", body: strings.NewReader(`{"message":{"kind":"user","parts":[{"type":"text","text":"a","url":"http://x"}]}}`), status: 400, code: "bad_request", message: `field "url" does not belong in a text part`},
		{name: "file without url", body: strings.NewReader(`{"message":{"kind":"user","parts":[{"type":"file","mediaType":"image/png"}]}}`), status: 400, code: "bad_request", message: `needs "url"`},
		{name: "file bad scheme", body: strings.NewReader(`{"message":{"kind":"user","parts":[{"type":"file","mediaType":"image/png","url":"file:///etc/passwd"}]}}`), status: 400, code: "bad_request", message: "data:, http: or https:"},
		{name: "data part without data", body: strings.NewReader(`{"message":{"kind":"user","parts":[{"type":"data","name":"x"}]}}`), status: 400, code: "bad_request", message: `needs "data"`},
		{name: "uid not string", body: strings.NewReader(`{"message":"hi","uid":5}`), status: 400, code: "bad_request", message: `"uid" must not be number`},
		{name: "uid empty", body: strings.NewReader(`{"message":"hi","uid":""}`), status: 400, code: "bad_request", message: "uid"},
		{name: "uid too long", body: strings.NewReader(`{"message":"hi","uid":"` + strings.Repeat("u", 129) + `"}`), status: 400, code: "bad_request", message: "uid"},
		{name: "uid control", body: strings.NewReader(`{"message":"hi","uid":"a\u0007b"}`), status: 400, code: "bad_request", message: "uid"},
		{name: "uid twice", body: strings.NewReader(`{"message":{"kind":"user","body":"hi","metadata":{"uid":"a"}},"uid":"b"}`), status: 400, code: "bad_request", message: "both at the top level"},
		{name: "bad session", body: strings.NewReader(`{"message":"hi","session":"no spaces"}`), status: 400, code: "invalid_name", message: "session"},
		{name: "empty session", body: strings.NewReader(`{"message":"hi","session":""}`), status: 400, code: "invalid_name", message: "session"},
		{name: "bad agent name", path: "/agents/-bad/i1", body: strings.NewReader(`{"message":"hi"}`), status: 400, code: "invalid_name", message: "agent"},
		{name: "bad instance name", path: "/agents/echo/in%20stance", body: strings.NewReader(`{"message":"hi"}`), status: 400, code: "invalid_name", message: "instance"},
		{name: "long instance name", path: "/agents/echo/" + strings.Repeat("i", 129), body: strings.NewReader(`{"message":"hi"}`), status: 400, code: "invalid_name", message: "instance"},
		{name: "unknown agent", path: "/agents/nobody/i1", body: strings.NewReader(`{"message":"hi"}`), status: 404, code: "not_found", message: "nobody"},
		{name: "text/plain", ct: "text/plain", body: strings.NewReader(`{"message":"hi"}`), status: 415, code: "unsupported_media_type"},
		{name: "no content type", ct: "-", body: strings.NewReader(`{"message":"hi"}`), status: 415, code: "unsupported_media_type"},
		{name: "other charset", ct: "application/json; charset=latin1", body: strings.NewReader(`{"message":"hi"}`), status: 415, code: "unsupported_media_type"},
		{name: "too large", body: strings.NewReader(big), status: 413, code: "payload_too_large", message: "65536"},
		// No Content-Length: the limit is found while reading.
		{name: "too large chunked", body: io.MultiReader(strings.NewReader(big)), status: 413, code: "payload_too_large"},
		{name: "busy reject", path: "/agents/strict/i1", body: strings.NewReader(`{"message":"second"}`), status: 409, code: "session_busy", message: "unsettled"},
		{name: "idempotency key too long", header: map[string]string{"Idempotency-Key": strings.Repeat("k", 257)}, body: strings.NewReader(`{"message":"hi"}`), status: 400, code: "bad_request", message: "Idempotency-Key"},
		{name: "idempotency key not ascii", header: map[string]string{"Idempotency-Key": "clé"}, body: strings.NewReader(`{"message":"hi"}`), status: 400, code: "bad_request", message: "Idempotency-Key"},
		{name: "panicking directory", path: "/agents/boom/i1", body: strings.NewReader(`{"message":"hi"}`), status: 500, code: "internal"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if path == "" {
				path = "/agents/echo/errors"
			}
			h := map[string]string{"Content-Type": "application/json"}
			switch tc.ct {
			case "":
			case "-":
				delete(h, "Content-Type")
			default:
				h["Content-Type"] = tc.ct
			}
			for k, v := range tc.header {
				h[k] = v
			}
			status, hdr, b := e.do(t, http.MethodPost, path, tc.body, h)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, b)
			}
			if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q", ct)
			}
			eb := errorOf(t, b)
			if eb["code"] != tc.code {
				t.Errorf("code %v, want %s: %s", eb["code"], tc.code, b)
			}
			if msg, _ := eb["message"].(string); !strings.Contains(msg, tc.message) || msg == "" {
				t.Errorf("message %q does not contain %q", msg, tc.message)
			}
		})
	}
	// Nothing but the one setup delivery was admitted.
	if n := e.admitted.Load(); n != 1 {
		t.Errorf("%d admissions", n)
	}
	res, err := e.c.Read(ctx, "echo", "errors", "", record.Start, 0)
	if err != nil || res.Incarnation != "" {
		t.Errorf("a failed delivery created the stream: %+v %v", res, err)
	}
}

func TestDeliverErrorGolden(t *testing.T) {
	e := newEnv(t)
	_, _, b := e.postJSON(t, "/agents/echo/i1", `{"message":{"kind":"robot","body":"hi"}}`, nil)
	golden(t, "error_bad_request.json", b)
}

func TestIdempotency(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	key := map[string]string{"Idempotency-Key": "order-42"}
	body := `{"message":"pay the invoice"}`
	s1, _, b1 := e.postJSON(t, "/agents/echo/i1", body, key)
	s2, h2, b2 := e.postJSON(t, "/agents/echo/i1", body, key)
	if s1 != 202 || s2 != 202 {
		t.Fatalf("statuses %d %d: %s %s", s1, s2, b1, b2)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("replay body differs:\n%s\n%s", b1, b2)
	}
	if h2.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay not flagged")
	}
	if n := e.admitted.Load(); n != 1 {
		t.Errorf("Admitted called %d times; a replay admits nothing", n)
	}
	res, err := e.c.Read(ctx, "echo", "i1", "", record.Start, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Batches) != 1 {
		t.Fatalf("%d batches after a replay, want 1", len(res.Batches))
	}

	// The same key with another body is a reuse.
	s3, _, b3 := e.postJSON(t, "/agents/echo/i1", `{"message":"pay it twice"}`, key)
	if s3 != http.StatusUnprocessableEntity || errorOf(t, b3)["code"] != "idempotency_key_reused" {
		t.Fatalf("reuse: %d %s", s3, b3)
	}
	// The same key and body on another instance is another request.
	s4, _, b4 := e.postJSON(t, "/agents/echo/i2", body, key)
	if s4 != 202 || bytes.Equal(b4, b1) {
		t.Fatalf("other instance: %d %s", s4, b4)
	}
	// Through the client.
	req := wire.DeliverRequest{Message: wire.Message{Body: "via client"}}
	a1, err := e.c.Deliver(ctx, "echo", "i3", req, "k")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := e.c.Deliver(ctx, "echo", "i3", req, "k")
	if err != nil || a1 != a2 {
		t.Fatalf("client replay %+v %+v %v", a1, a2, err)
	}
	req.Message.Body = "changed"
	if _, err := e.c.Deliver(ctx, "echo", "i3", req, "k"); !client.IsCode(err, wire.CodeIdempotencyKeyReused) {
		t.Fatalf("client reuse: %v", err)
	}
}

func TestBusyEnqueue(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, agent := range []string{"echo", "plain"} {
		for i := 0; i < 2; i++ {
			if _, err := e.c.Deliver(ctx, agent, "i1", wire.DeliverRequest{Message: wire.Message{Body: "again"}}, ""); err != nil {
				t.Fatalf("%s delivery %d: %v", agent, i, err)
			}
		}
	}
	pending, err := e.db.Pending(ctx, record.Key{Agent: "echo", Instance: "i1", Session: "default"})
	if err != nil || len(pending) != 2 {
		t.Fatalf("pending %v %v", pending, err)
	}
}

func TestRoutesAndMethods(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/nope", 404, "not_found"},
		{"POST", "/agents/echo", 405, "method_not_allowed"},
		{"GET", "/agents/echo/i1/elsewhere", 404, "not_found"},
		{"PUT", "/agents/echo/i1", 405, "method_not_allowed"},
		{"GET", "/agents/echo/i1", 405, "method_not_allowed"},
		{"POST", "/agents/echo/i1/conversation", 405, "method_not_allowed"},
		{"PUT", "/agents/echo/i1/stream", 405, "method_not_allowed"},
		{"POST", "/healthz", 405, "method_not_allowed"},
	}
	for _, tc := range cases {
		status, h, b := e.do(t, tc.method, tc.path, nil, nil)
		if status != tc.status {
			t.Errorf("%s %s: %d, want %d: %s", tc.method, tc.path, status, tc.status, b)
			continue
		}
		if got := errorOf(t, b)["code"]; got != tc.code {
			t.Errorf("%s %s: code %v", tc.method, tc.path, got)
		}
		if tc.status == 405 && h.Get("Allow") == "" {
			t.Errorf("%s %s: no Allow header", tc.method, tc.path)
		}
	}
}

func TestStopAdmitting(t *testing.T) {
	e := newEnv(t)
	e.srv.StopAdmitting()
	status, _, b := e.postJSON(t, "/agents/echo/i1", `{"message":"late"}`, nil)
	if status != http.StatusServiceUnavailable || errorOf(t, b)["code"] != "shutting_down" {
		t.Fatalf("%d %s", status, b)
	}
	// Reads go on.
	if _, err := e.c.Read(context.Background(), "echo", "i1", "", "", 0); err != nil {
		t.Fatal(err)
	}
}
