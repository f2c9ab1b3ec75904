package transport_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// TestLifecycleSerialised: a change to a conversation while another change
// of it is in progress is refused with 409 mutation_in_progress, never
// queued behind it; a change to another session goes through, and a
// delete of the instance waits for nobody but is refused too.
func TestLifecycleSerialised(t *testing.T) {
	entered := make(chan []record.Key, 1)
	release := make(chan struct{})
	e := newEnv(t, func(o *envConfig) {
		o.Quiesce = func(ctx context.Context, keys []record.Key, abortFirst bool, fn func(context.Context) error) error {
			if keys[0].Session == "held" {
				entered <- keys
				<-release
			}
			return fn(ctx)
		}
	})
	ctx := testCtx(t)
	for _, s := range []string{"held", "other"} {
		key := record.Key{Agent: "echo", Instance: "i1", Session: s}
		if _, _, err := e.db.Admit(ctx, log.Admission{Key: key, Records: []record.Record{userText("hi")}}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan int, 1)
	go func() {
		status, _, _ := e.postJSON(t, "/agents/echo/i1/reset", `{"session":"held"}`, nil)
		done <- status
	}()
	if keys := <-entered; len(keys) != 1 || keys[0].Session != "held" {
		t.Fatalf("quiesced %v", keys)
	}
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/agents/echo/i1/reset", `{"session":"held"}`},
		{"POST", "/agents/echo/i1/rewind?session=held", `{"entryId":"x"}`},
		{"POST", "/agents/echo/i1/regenerate", `{"session":"held"}`},
		{"DELETE", "/agents/echo/i1", ""},
	} {
		status, _, b := e.do(t, tc.method, tc.path, strings.NewReader(tc.body), map[string]string{"Content-Type": "application/json"})
		if status != http.StatusConflict || errorOf(t, b)["code"] != wire.CodeMutationInProgress {
			t.Errorf("%s %s during a reset: %d %s", tc.method, tc.path, status, b)
		}
	}
	if status, _, b := e.postJSON(t, "/agents/echo/i1/reset", `{"session":"other"}`, nil); status != 200 {
		t.Errorf("another session: %d %s", status, b)
	}
	close(release)
	if status := <-done; status != 200 {
		t.Fatalf("the held reset: %d", status)
	}
	// Free again.
	if status, _, b := e.do(t, "DELETE", "/agents/echo/i1", nil, nil); status != 200 {
		t.Fatalf("delete after: %d %s", status, b)
	}
}

// Under access control: listings and checkpoints need read, rewind, fork,
// reset, delete and regenerate need manage; a listing shows
// only the instances the caller may read; a fork into another instance
// needs manage there too; the regenerated message names who regenerated it.
func TestLifecycleAccess(t *testing.T) {
	a := staticTokens(t, map[string][]string{
		"alice":   {"read:echo/{sub}", "deliver:echo/{sub}"},
		"manager": {"read:echo/alice", "manage:echo/alice", "deliver:echo/alice"},
		"ops":     {"read:*/*", "deliver:*/*", "manage:*/*"},
	})
	e := newEnv(t, withAuth(a, auth.Limits{}))
	as := func(who string) map[string]string {
		return map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + who}
	}
	for _, inst := range []string{"alice", "bob"} {
		if st, _, b := e.do(t, "POST", "/agents/echo/"+inst, strings.NewReader(`{"message":"hi"}`), as("ops")); st != 202 {
			t.Fatalf("deliver: %d %s", st, b)
		}
	}
	cps := func(who string) (int, []byte) {
		st, _, b := e.do(t, "GET", "/agents/echo/alice/checkpoints", nil, as(who))
		return st, b
	}
	st, b := cps("alice")
	if st != 200 {
		t.Fatalf("checkpoints: %d %s", st, b)
	}
	var cp struct {
		Checkpoints []struct {
			EntryID string `json:"entryId"`
		} `json:"checkpoints"`
	}
	if err := json.Unmarshal(b, &cp); err != nil || len(cp.Checkpoints) != 1 {
		t.Fatalf("checkpoints %s", b)
	}
	entry := cp.Checkpoints[0].EntryID
	// alice may read and deliver but not manage her conversation.
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/agents/echo/alice/rewind", `{"entryId":"` + entry + `"}`},
		{"POST", "/agents/echo/alice/reset", ``},
		{"POST", "/agents/echo/alice/fork", `{"entryId":"` + entry + `","session":"f"}`},
		{"DELETE", "/agents/echo/alice", ``},
		{"GET", "/agents/echo/bob/sessions", ``},
	} {
		if st, _, b := e.do(t, tc.method, tc.path, strings.NewReader(tc.body), as("alice")); st != http.StatusForbidden {
			t.Errorf("alice %s %s: %d %s", tc.method, tc.path, st, b)
		}
	}
	// The listing shows alice only her own instance.
	st, _, b = e.do(t, "GET", "/agents/echo", nil, as("alice"))
	if st != 200 || !strings.Contains(string(b), `"instanceId":"alice"`) || strings.Contains(string(b), `"bob"`) {
		t.Fatalf("alice's listing: %d %s", st, b)
	}
	// A fork into an instance the manager may not manage is refused; into
	// a session of alice's, allowed.
	if st, _, b := e.do(t, "POST", "/agents/echo/alice/fork", strings.NewReader(`{"entryId":"`+entry+`","instanceId":"carol"}`), as("manager")); st != http.StatusForbidden {
		t.Errorf("fork into carol: %d %s", st, b)
	}
	if st, _, b := e.do(t, "POST", "/agents/echo/alice/fork", strings.NewReader(`{"entryId":"`+entry+`","session":"f"}`), as("manager")); st != http.StatusCreated {
		t.Errorf("fork into a session: %d %s", st, b)
	}
	// Regenerate: not by alice (it rewinds); by the manager, and the
	// message then names the manager.
	if st, _, b := e.do(t, "POST", "/agents/echo/alice/regenerate", nil, as("alice")); st != http.StatusForbidden {
		t.Errorf("alice's regenerate: %d %s", st, b)
	}
	if st, _, b := e.do(t, "POST", "/agents/echo/alice/regenerate", nil, as("manager")); st != http.StatusAccepted {
		t.Fatalf("regenerate: %d %s", st, b)
	}
	st, _, b = e.do(t, "GET", "/agents/echo/alice/conversation", nil, as("alice"))
	if st != 200 || strings.Count(string(b), `"principal":{`) != 2 || !strings.Contains(string(b), `"subject":"manager"`) {
		t.Fatalf("after regenerate: %d %s", st, b)
	}
	// The regenerate moved the path on: the original message is off it.
	if st, _, b := e.do(t, "POST", "/agents/echo/alice/rewind", strings.NewReader(`{"entryId":"`+entry+`"}`), as("manager")); st != http.StatusConflict {
		t.Errorf("manager's rewind to the regenerated message: %d %s", st, b)
	}
	_, b = cps("manager")
	if err := json.Unmarshal(b, &cp); err != nil || len(cp.Checkpoints) != 1 {
		t.Fatalf("checkpoints %s", b)
	}
	if st, _, b := e.do(t, "POST", "/agents/echo/alice/rewind", strings.NewReader(`{"entryId":"`+cp.Checkpoints[0].EntryID+`"}`), as("manager")); st != 200 {
		t.Errorf("manager's rewind: %d %s", st, b)
	}
}
