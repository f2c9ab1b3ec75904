package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLoopbackOnly(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:8080": true, "[::1]:8080": true, "127.9.9.9:1": true,
		":8080": false, "0.0.0.0:8080": false, "[::]:8080": false, "192.168.1.5:8080": false, "example.com:80": false, "garbage": false,
	} {
		if got := loopbackOnly(addr); got != want {
			t.Errorf("loopbackOnly(%q) = %v, want %v", addr, got, want)
		}
	}
}

// Beyond loopback without access control, the service refuses to start,
// creating nothing, unless the operator passes Insecure.
func TestRefusesExposureWithoutAuth(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	_, err := Start(Config{Listen: "0.0.0.0:0", Data: data, Logger: quietLogger()})
	if !errors.Is(err, ErrExposed) {
		t.Fatalf("Start on 0.0.0.0 without auth: %v, want ErrExposed", err)
	}
	if _, serr := os.Stat(data); !os.IsNotExist(serr) {
		t.Errorf("the refused start created %s", data)
	}
	svc, err := Start(Config{Listen: "0.0.0.0:0", Data: data, Insecure: true, Logger: quietLogger(), ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatalf("Start with Insecure: %v", err)
	}
	if err := svc.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
