package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/worker/natsbus"
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

// The embedded broker's port is refused where it would let anyone in:
// beyond loopback without the workers' password and TLS, and anywhere
// without the password when access control is on. No flag overrides it.
func TestRefusesExposedBroker(t *testing.T) {
	on := &auth.Config{Tokens: []auth.TokenConfig{{SHA256: strings.Repeat("ab", 32), Principal: "ops", Scopes: []string{"admin"}}}}
	tls := func(c *Config) { c.NATSTLSCert, c.NATSTLSKey = "cert.pem", "key.pem" }
	pw := func(c *Config) { c.NATSWorkerPassword = "s3cret" }
	for _, tc := range []struct {
		name    string
		cfg     func(*Config)
		refused bool
	}{
		{"no port", func(c *Config) {}, false},
		{"no port, auth on", func(c *Config) { c.Auth = on }, false},
		{"loopback, open", func(c *Config) { c.NATSListen = "127.0.0.1:4222" }, false},
		{"loopback, auth on, no password", func(c *Config) { c.NATSListen = "127.0.0.1:4222"; c.Auth = on }, true},
		{"loopback, auth on, password", func(c *Config) { c.NATSListen = "127.0.0.1:4222"; c.Auth = on; pw(c) }, false},
		{"all interfaces, nothing", func(c *Config) { c.NATSListen = "0.0.0.0:4222" }, true},
		{"all interfaces, auth on", func(c *Config) { c.NATSListen = "0.0.0.0:4222"; c.Auth = on }, true},
		{"all interfaces, insecure", func(c *Config) { c.NATSListen = "0.0.0.0:4222"; c.Insecure = true }, true},
		{"all interfaces, password, no TLS", func(c *Config) { c.NATSListen = "0.0.0.0:4222"; pw(c) }, true},
		{"all interfaces, TLS, no password", func(c *Config) { c.NATSListen = "0.0.0.0:4222"; tls(c) }, true},
		{"all interfaces, a cert without its key", func(c *Config) { c.NATSListen = ":4222"; pw(c); c.NATSTLSCert = "cert.pem" }, true},
		{"all interfaces, password and TLS", func(c *Config) { c.NATSListen = ":4222"; pw(c); tls(c) }, false},
		{"external NATS", func(c *Config) { c.NATSURL = "nats://10.0.0.1:4222"; c.NATSListen = "0.0.0.0:4222" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Listen: DefaultListen}
			tc.cfg(&cfg)
			err := checkNATSExposure(cfg)
			if tc.refused != errors.Is(err, ErrBrokerExposed) {
				t.Fatalf("checkNATSExposure: %v, want refused=%v", err, tc.refused)
			}
		})
	}
	// Refused before anything is created.
	data := filepath.Join(t.TempDir(), "data")
	_, err := Start(Config{Listen: "127.0.0.1:0", NATSListen: "0.0.0.0:0", Data: data, Insecure: true, Logger: quietLogger()})
	if !errors.Is(err, ErrBrokerExposed) {
		t.Fatalf("Start with --nats-listen 0.0.0.0: %v, want ErrBrokerExposed", err)
	}
	if _, serr := os.Stat(data); !os.IsNotExist(serr) {
		t.Errorf("the refused start created %s", data)
	}
}

// With the workers' password, the service's broker port lets in only who
// presents it: a client without credentials is refused.
func TestBrokerPortNeedsCredentials(t *testing.T) {
	svc, _ := testService(t, func(c *Config) { c.NATSListen = "127.0.0.1:0"; c.NATSWorkerPassword = "s3cret" })
	url := svc.emb.ClientURL()
	if nc, err := nats.Connect(url, nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials was let in")
	}
	nc, err := nats.Connect(url, nats.UserInfo(natsbus.WorkerUser, "s3cret"), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("the worker's credentials: %v", err)
	}
	nc.Close()
}
