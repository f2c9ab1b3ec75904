package remote_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/natsbus"
	"github.com/convlog/convlog/worker/pool"
	"github.com/convlog/convlog/worker/remote"
)

const workerPassword = "worker-secret-for-the-test"

// selfSigned writes a CA-less self-signed certificate for 127.0.0.1 and
// its key into dir, and returns their paths (the cert is its own CA).
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "convlog test broker"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// startListeningOwner is startOwner with the broker on a loopback TCP port
// that speaks TLS and lets in the owner (in-process) and the workers.
func startListeningOwner(t *testing.T) (o *owner, url, ca string) {
	t.Helper()
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	emb, err := natsbus.StartEmbeddedWith(natsbus.EmbeddedOptions{
		Dir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0",
		WorkerPassword: workerPassword, TLSCert: cert, TLSKey: key,
	})
	if err != nil {
		t.Fatal(err)
	}
	return startOwnerOn(t, emb), emb.ClientURL(), cert
}

// violations collects a connection's permission refusals.
type violations chan error

func (v violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	select {
	case v <- err:
	default:
	}
}

// refusedFor waits for the broker's refusal naming subject.
func (v violations) refusedFor(t *testing.T, subject string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case err := <-v:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
				return
			}
		case <-deadline:
			t.Fatalf("no permissions violation for %q", subject)
		}
	}
}

// The broker's access matrix: who may connect, and what a worker's
// credentials let it do. Before the broker had users, anyone who reached
// --nats-listen could read every conversation through the owner, forge
// entries, watch every tenant's tokens, abort turns and edit the leases.
func TestBrokerAccessMatrix(t *testing.T) {
	o, url, ca := startListeningOwner(t)

	t.Run("connect", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			opts []nats.Option
			ok   bool
		}{
			{"no credentials", []nats.Option{nats.RootCAs(ca)}, false},
			{"wrong password", []nats.Option{nats.RootCAs(ca), nats.UserInfo(natsbus.WorkerUser, "guess")}, false},
			{"the owner's name, no password", []nats.Option{nats.RootCAs(ca), nats.UserInfo(natsbus.OwnerUser, "")}, false},
			{"a token", []nats.Option{nats.RootCAs(ca), nats.Token(workerPassword)}, false},
			{"worker, without TLS trust", []nats.Option{nats.UserInfo(natsbus.WorkerUser, workerPassword)}, false},
			{"worker", []nats.Option{nats.RootCAs(ca), nats.UserInfo(natsbus.WorkerUser, workerPassword)}, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				nc, err := nats.Connect(url, append(tc.opts, nats.Timeout(5*time.Second))...)
				if nc != nil {
					defer nc.Close()
				}
				if (err == nil) != tc.ok {
					t.Fatalf("connect: %v, want ok=%v", err, tc.ok)
				}
			})
		}
	})

	v := make(violations, 64)
	nc, err := nats.Connect(url, nats.RootCAs(ca), nats.UserInfo(natsbus.WorkerUser, workerPassword),
		nats.CustomInboxPrefix(natsbus.WorkerInboxPrefix), nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ns := natsbus.DefaultNamespace
	sub := func(subject string) func() error {
		return func() error { _, err := nc.SubscribeSync(subject); return err }
	}
	pub := func(subject string) func() error {
		return func() error { return nc.Publish(subject, []byte("x")) }
	}
	for _, tc := range []struct {
		name, subject string
		do            func() error
	}{
		{"read every conversation's live deltas", "convlog.live.>", sub("convlog.live.>")},
		{"read one conversation's deltas", "convlog.live.echo.i.s", sub("convlog.live.echo.i.s")},
		{"answer the owner's log requests", ns.LogSubject("*"), sub(ns.LogSubject("*"))},
		{"read the owner's replies", "_INBOX.>", sub("_INBOX.>")},
		{"read the doorbells raw", "convlog.submissions.>", sub("convlog.submissions.>")},
		{"publish an abort", ns.AbortSubject(), pub(ns.AbortSubject())},
		{"ring a doorbell", "convlog.submissions.echo", pub("convlog.submissions.echo")},
		{"take the namespace claim", "$KV.convlog_leases.namespace.owner", pub("$KV.convlog_leases.namespace.owner")},
		{"purge the lease bucket", "$JS.API.STREAM.PURGE.KV_convlog_leases", pub("$JS.API.STREAM.PURGE.KV_convlog_leases")},
		{"delete the lease bucket", "$JS.API.STREAM.DELETE.KV_convlog_leases", pub("$JS.API.STREAM.DELETE.KV_convlog_leases")},
		{"change the lease bucket", "$JS.API.STREAM.UPDATE.KV_convlog_leases", pub("$JS.API.STREAM.UPDATE.KV_convlog_leases")},
		{"delete the submissions stream", "$JS.API.STREAM.DELETE.CONVLOG_SUBMISSIONS", pub("$JS.API.STREAM.DELETE.CONVLOG_SUBMISSIONS")},
		{"delete the workers' consumer", "$JS.API.CONSUMER.DELETE.CONVLOG_SUBMISSIONS.convlog-workers", pub("$JS.API.CONSUMER.DELETE.CONVLOG_SUBMISSIONS.convlog-workers")},
		{"make a stream", "$JS.API.STREAM.CREATE.STEAL", pub("$JS.API.STREAM.CREATE.STEAL")},
		{"list the streams", "$JS.API.STREAM.LIST", pub("$JS.API.STREAM.LIST")},
	} {
		t.Run("worker may not "+tc.name, func(t *testing.T) {
			if err := tc.do(); err != nil {
				t.Fatal(err)
			}
			v.refusedFor(t, tc.subject)
		})
	}

	// What the role may do is what a worker needs: a remote pool on these
	// credentials runs a turn, and answers an abort of another.
	t.Run("worker runs turns and answers aborts", func(t *testing.T) {
		startWorkerOn(t, o, 200*time.Millisecond, func() (*nats.Conn, error) {
			return natsbus.ConnectWith(url, natsbus.Credentials{User: natsbus.WorkerUser, Password: workerPassword, TLSCA: ca}, true, nil)
		})
		key := record.Key{Agent: "echo", Instance: "i", Session: "matrix"}
		if got := o.settled(t, o.admit(t, key, "hello").ID); got.Status != record.StatusCompleted {
			t.Fatalf("turn over worker credentials: %+v", got)
		}
		slow := record.Key{Agent: "slow", Instance: "i", Session: "matrix"}
		running := o.admit(t, slow, "one two three four five six seven eight nine ten")
		waitFor(t, "the slow turn to start", func() bool {
			s, err := o.db.Submission(context.Background(), running.ID)
			return err == nil && s.Status == record.StatusRunning
		})
		got, err := o.srv.Abort(context.Background(), running.ID)
		if err != nil || got.Status != record.StatusAborted {
			t.Fatalf("abort through a worker's credentials: %+v %v", got, err)
		}
	})
}

// startWorkerOn runs a remote worker's pool on a connection that dial
// makes, closed at the end.
func startWorkerOn(t *testing.T, o *owner, sweep time.Duration, dial func() (*nats.Conn, error)) (*remote.Client, *pool.Pool) {
	t.Helper()
	nc, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	c, err := remote.NewClient(remote.ClientConfig{NATS: nc, RetryFor: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	agents := pool.NewRegistry()
	if err := agents.Register("echo", worker.Echo{}, ""); err != nil {
		t.Fatal(err)
	}
	if err := agents.Register("slow", worker.Echo{Delay: time.Second}, ""); err != nil {
		t.Fatal(err)
	}
	if err := agents.RegisterWith("ask", asker{}, worker.AgentOptions{Approvals: true}); err != nil {
		t.Fatal(err)
	}
	if err := agents.RegisterWith("asktimeout", asker{}, worker.AgentOptions{Approvals: true, ApprovalTimeout: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	bus, err := natsbus.NewDeltaPublisher(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.NewPool(pool.Config{Log: c, NATS: nc, Agents: agents, Deltas: bus, Remote: true,
		LeaseTTL: testTTL, SweepInterval: sweep, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- p.Run(ctx) }()
	go func() { done <- remote.ServeAborts(ctx, nc, "", p) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
		nc.Close()
	})
	return c, p
}
