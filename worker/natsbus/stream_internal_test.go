package natsbus

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// limitedBroker is an embedded NATS whose JetStream may store at most
// maxStore bytes, as a shared broker's operator would configure it.
func limitedBroker(t *testing.T, maxStore int64) jetstream.JetStream {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		JetStream: true, StoreDir: t.TempDir(), DontListen: true, NoSigs: true, NoLog: os.Getenv("NATSLOG") == "",
		JetStreamMaxStore: maxStore, JetStreamMaxMemory: 64 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("NATSLOG") != "" {
		s.ConfigureLogger()
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close(); s.Shutdown(); s.WaitForShutdown() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Issue 8 item 21: an update refused for a resource limit deleted the
// stream, and its queued doorbells with it. Only a retention change, which
// JetStream cannot make in place, may replace the stream.
func TestEnsureStreamKeepsStreamOnLimitError(t *testing.T) {
	ctx := context.Background()
	js := limitedBroker(t, SubmissionsStreamMaxBytes/2) // less than the stream's limit
	ns := Namespace("lim")
	// A stream made by hand within the broker's limits, with doorbells.
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: ns.StreamName(), Subjects: []string{ns.submitWildcard()},
		Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage, MaxBytes: SubmissionsStreamMaxBytes / 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, ns.submitSubject("echo"), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	_, err = EnsureStream(ctx, js, ns)
	if err == nil {
		t.Fatal("ensureStream met a stream limit larger than the broker's store")
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("not the broker's refusal: %v", err)
	}
	info, ierr := st.Info(ctx)
	if ierr != nil {
		t.Fatalf("the stream is gone after %v: %v", err, ierr)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("doorbells %d, want 3 (after %v)", info.State.Msgs, err)
	}
}

// An older deployment's work-queue stream and ack-explicit consumer are
// replaced, since JetStream cannot change them in place.
func TestEnsureStreamReplacesOldRetention(t *testing.T) {
	ctx := context.Background()
	js := limitedBroker(t, 2<<30)
	ns := Namespace("old")
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: ns.StreamName(), Subjects: []string{ns.submitWildcard()},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: ns.ConsumerName(), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureStream(ctx, js, ns); err != nil {
		t.Fatal(err)
	}
	s2, err := js.Stream(ctx, ns.StreamName())
	if err != nil {
		t.Fatal(err)
	}
	if got := s2.CachedInfo().Config.Retention; got != jetstream.LimitsPolicy {
		t.Fatalf("retention %v", got)
	}
	// And a stream already right but an old consumer: only the consumer.
	if err := s2.DeleteConsumer(ctx, ns.ConsumerName()); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: ns.ConsumerName(), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, ns.submitSubject("echo"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	cons, err := EnsureStream(ctx, js, ns)
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.AckPolicy; got != jetstream.AckNonePolicy {
		t.Fatalf("ack policy %v", got)
	}
	if info, _ := s2.Info(ctx); info.State.Msgs != 1 {
		t.Fatalf("replacing the consumer lost the stream's doorbells: %d", info.State.Msgs)
	}
}
