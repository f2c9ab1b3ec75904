package service

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/convlog/convlog/transport/client"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testService starts the whole service in-process on a temp folder and a
// random loopback port, and stops it gracefully with the test.
func testService(t testing.TB, mutate func(*Config)) (*Service, *client.Client) {
	t.Helper()
	cfg := Config{
		Listen:          "127.0.0.1:0",
		Data:            t.TempDir(),
		Heartbeat:       time.Second,
		EchoDelay:       0,
		ShutdownTimeout: 2 * time.Second,
		Logger:          quietLogger(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	svc, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return svc, &client.Client{BaseURL: "http://" + svc.Addr()}
}

// quietLogger shows warnings with -v, nothing otherwise.
func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
