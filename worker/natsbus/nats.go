package natsbus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Embedded is a NATS server with JetStream running inside this process.
type Embedded struct {
	Server *server.Server
	// ownerPassword is the owner's, for the in-process connection; "" when
	// the broker has no users.
	ownerPassword string
}

// EmbeddedOptions configure the embedded broker.
type EmbeddedOptions struct {
	Dir    string // the JetStream store
	Listen string // "" for no TCP port at all (in-process only) or host:port
	// Namespace whose subjects the worker user may use.
	Namespace Namespace
	// WorkerPassword lets remote workers in as WorkerUser, with
	// WorkerPermissions; "" lets no worker in.
	WorkerPassword string
	// TLSCert and TLSKey are PEM files: the TCP port speaks TLS only.
	TLSCert, TLSKey string
	// Open listens with no users at all, as before there were any: for a
	// loopback port without access control (the caller decides when).
	Open bool
}

// StartEmbedded starts NATS with JetStream storing under dir. listen is
// "" for no TCP port at all (in-process connections only) or host:port;
// a port has no users (EmbeddedOptions.Open).
func StartEmbedded(dir, listen string) (*Embedded, error) {
	return StartEmbeddedWith(EmbeddedOptions{Dir: dir, Listen: listen, Open: true})
}

// StartEmbeddedWith starts NATS with JetStream as o says.
func StartEmbeddedWith(o EmbeddedOptions) (*Embedded, error) {
	dir, listen := o.Dir, o.Listen
	opts := &server.Options{
		JetStream:  true,
		StoreDir:   dir,
		DontListen: listen == "",
		NoSigs:     true,
		NoLog:      true,
		ServerName: "convlog",
		// A fixed size, not the broker's default of 75% of the free disk,
		// so that the need is known and checked at start.
		JetStreamMaxStore: EmbeddedMaxStore,
	}
	if listen != "" {
		host, port, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("nats listen %q: %w", listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("nats listen %q: %w", listen, err)
		}
		if p == 0 {
			p = server.RANDOM_PORT // nats-server reads 0 as its default, 4222
		}
		opts.Host, opts.Port = host, p
	}
	ownerPassword, err := brokerAuth(opts, o)
	if err != nil {
		return nil, err
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded nats: not ready after 30s")
	}
	return &Embedded{Server: s, ownerPassword: ownerPassword}, nil
}

// Connect opens an in-process client connection, as the owner.
func (e *Embedded) Connect() (*nats.Conn, error) {
	opts := []nats.Option{nats.InProcessServer(e.Server), nats.Name("convlog"), nats.MaxReconnects(-1)}
	if e.ownerPassword != "" {
		opts = append(opts, nats.UserInfo(OwnerUser, e.ownerPassword))
	}
	return nats.Connect("", opts...)
}

// ClientURL is the URL of the server's TCP port ("" without one).
func (e *Embedded) ClientURL() string { return e.Server.ClientURL() }

// Shutdown stops the server and waits for it.
func (e *Embedded) Shutdown() {
	e.Server.Shutdown()
	e.Server.WaitForShutdown()
}

// Connect dials an external NATS. It keeps reconnecting forever: the log,
// not NATS, is what admission depends on, so the service rides out broker
// outages. RetryOnFailedConnect lets it start while the broker is down.
func Connect(url string) (*nats.Conn, error) { return connect(url) }

func connect(url string, extra ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append([]nats.Option{
		nats.Name("convlog"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
	}, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", url, err)
	}
	return nc, nil
}

// EnsureStream creates or updates the submissions stream and the workers'
// durable consumer.
//
// A message is a doorbell, not the submission (the log has that): the
// stream keeps messages under limits rather than as a work queue, and the
// consumer takes them without acks, so that the broker neither tracks an
// ack nor deletes a message per submission. A doorbell lost to a limit or
// a crash is found by the pool's sweep of the log.
func EnsureStream(ctx context.Context, js jetstream.JetStream, ns Namespace) (jetstream.Consumer, error) {
	return EnsureStreamReplicas(ctx, js, ns, 1)
}

// EnsureStreamReplicas is EnsureStream with the stream kept on replicas
// servers of a NATS cluster (1 to 5; below 1 is 1). JetStream acks a
// publish once a majority of them has it.
func EnsureStreamReplicas(ctx context.Context, js jetstream.JetStream, ns Namespace, replicas int) (jetstream.Consumer, error) {
	cfg := jetstream.StreamConfig{
		Replicas:  replicasOrUnset(replicas),
		Name:      ns.StreamName(),
		Subjects:  []string{ns.submitWildcard()},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		MaxAge:    time.Hour,
		MaxBytes:  SubmissionsStreamMaxBytes,
		Discard:   jetstream.DiscardOld,
		// Relay retries after a lost ack republish with the same id; the
		// window must outlast any outage the relay rides out in one go.
		Duplicates: 10 * time.Minute,
	}
	stream, err := js.CreateOrUpdateStream(ctx, cfg)
	if retentionChangeRefused(err) {
		// An older deployment's stream with another retention policy,
		// which JetStream will not update in place: its doorbells are
		// disposable, so replace it. Any other refusal (a resource limit
		// of a shared broker, say) leaves the stream and its doorbells be.
		if derr := js.DeleteStream(ctx, cfg.Name); derr == nil {
			stream, err = createAfterDelete(ctx, js, cfg)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", ns.StreamName(), err)
	}
	ccfg := jetstream.ConsumerConfig{
		Durable:   ns.ConsumerName(),
		AckPolicy: jetstream.AckNonePolicy,
		// The consumer's state follows the stream's replicas (0).
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, ccfg)
	if ackPolicyChangeRefused(err) {
		// An older deployment's consumer with acks; likewise.
		if derr := stream.DeleteConsumer(ctx, ccfg.Durable); derr == nil {
			cons, err = stream.CreateOrUpdateConsumer(ctx, ccfg)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", ns.ConsumerName(), err)
	}
	return cons, nil
}

// retentionChangeRefused reports JetStream's refusal to change a stream's
// retention policy in place (to or from a work queue).
// createAfterDelete creates a stream just deleted. The broker removes a
// deleted stream's store in the background, and a create at that moment
// can fail on the vanishing folder (nats-server 2.15: "could not create
// storage directory ... no such file or directory", answered as the
// generic "error creating store for stream"): that refusal is retried a
// few times, any other is returned at once.
func createAfterDelete(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	for attempt := 1; ; attempt++ {
		stream, err := js.CreateStream(ctx, cfg)
		var apiErr *jetstream.APIError
		if err == nil || attempt == 5 || !errors.As(err, &apiErr) || apiErr.ErrorCode != jsErrStreamCreate {
			return stream, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
		}
	}
}

func retentionChangeRefused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStreamInvalidConfig &&
		strings.Contains(apiErr.Description, "can not change retention")
}

// ackPolicyChangeRefused reports JetStream's refusal to change a durable
// consumer's ack policy in place.
func ackPolicyChangeRefused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeConsumerCreate &&
		strings.Contains(apiErr.Description, "ack policy can not be updated")
}

// jsErrStreamInvalidConfig is JetStream's "stream configuration validation
// error" (server.JSStreamInvalidConfigF), which nats.go does not name.
const jsErrStreamInvalidConfig jetstream.ErrorCode = 10052

// replicasOrUnset leaves a single replica unset (0, the server's default
// of 1), so that a single-node deployment's stream and bucket configs are
// what they were before replicas could be set, and are not updated at
// every start.
func replicasOrUnset(n int) int {
	if n <= 1 {
		return 0
	}
	return n
}

// jsErrStreamCreate is JetStream's "error creating stream" family
// (server.JSStreamCreateErrF), which nats.go does not name either.
const jsErrStreamCreate jetstream.ErrorCode = 10049
