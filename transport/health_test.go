package transport_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

func TestHealth(t *testing.T) {
	var notReady error
	e := newEnv(t, func(o *envConfig) { o.Ready = readyFunc(func() error { return notReady }) })
	if status, _, b := e.do(t, "GET", "/healthz", nil, nil); status != 200 || string(b) != "{\"status\":\"ok\"}\n" {
		t.Errorf("healthz: %d %s", status, b)
	}
	if status, _, b := e.do(t, "GET", "/readyz", nil, nil); status != 200 || string(b) != "{\"status\":\"ready\"}\n" {
		t.Errorf("readyz: %d %s", status, b)
	}
	notReady = errors.New("relay disconnected")
	status, _, b := e.do(t, "GET", "/readyz", nil, nil)
	if eb := errorOf(t, b); status != 503 || eb["code"] != "not_ready" || eb["message"] != "relay disconnected" {
		t.Errorf("readyz with Ready failing: %d %s", status, b)
	}
	notReady = nil
	e.srv.StopAdmitting()
	if status, _, b := e.do(t, "GET", "/readyz", nil, nil); status != 503 {
		t.Errorf("readyz after StopAdmitting: %d %s", status, b)
	}
}

func TestReadyzLogClosed(t *testing.T) {
	e := newEnv(t)
	if err := e.db.Close(); err != nil {
		t.Fatal(err)
	}
	status, _, b := e.do(t, "GET", "/readyz", nil, nil)
	if status != 503 || errorOf(t, b)["code"] != "not_ready" {
		t.Errorf("readyz, log closed: %d %s", status, b)
	}
	// Other routes say the log is unavailable, not 500.
	status, _, b = e.postJSON(t, "/agents/echo/i1", `{"message":"hi"}`, nil)
	if status != 503 || errorOf(t, b)["code"] != "unavailable" {
		t.Errorf("deliver, log closed: %d %s", status, b)
	}
	status, _, b = e.do(t, "GET", "/agents/echo/i1/conversation", nil, nil)
	if status != 503 || errorOf(t, b)["code"] != "unavailable" {
		t.Errorf("read, log closed: %d %s", status, b)
	}
}

func TestNewRequiresLogAndConversations(t *testing.T) {
	if _, err := transport.New(transport.Options{Conversations: &conversation.Core{}}); err == nil {
		t.Error("New without Log")
	}
	if _, err := transport.New(transport.Options{Log: &log.DB{}}); err == nil {
		t.Error("New without Conversations")
	}
}

// Serve and Shutdown on a real listener: an open stream does not hold the
// stop up.
func TestServeShutdown(t *testing.T) {
	e := newEnv(t)
	srv, err := transport.New(transport.Options{Log: e.db, Conversations: newCore(t, e.db, agents{"echo": ""}, nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	c := &client.Client{BaseURL: "http://" + l.Addr().String(), HTTP: hc}
	ctx := testCtx(t)
	acc, err := c.Deliver(ctx, "echo", "i1", wire.DeliverRequest{Message: wire.Message{Body: "hi"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Stream(ctx, "echo", "i1", "", acc.Offset)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	nextComment(t, r)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := c.Deliver(ctx, "echo", "i1", wire.DeliverRequest{Message: wire.Message{Body: "late"}}, ""); err == nil {
		t.Fatal("delivered after shutdown")
	}
}
