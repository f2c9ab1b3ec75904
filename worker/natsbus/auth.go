package natsbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Role names of the embedded broker's users.
const (
	// OwnerUser is the serve process: every subject. Its password is drawn
	// at random each start and only used in-process, unless the operator
	// gives one (for a second owner-side process, none today).
	OwnerUser = "owner"
	// WorkerUser is a remote `convlog worker`: only the subjects it uses.
	WorkerUser = "worker"
)

// WorkerInboxPrefix is where a worker's replies come: a worker may
// subscribe there and nowhere under the owner's _INBOX, so it cannot read
// the answers the broker and the workers send the owner.
const WorkerInboxPrefix = "_INBOX_worker"

// WorkerPermissions are the subjects a remote worker of namespace ns needs,
// and no more: the submissions consumer (read, never created or changed),
// the session lease keys of the lease bucket (not the namespace claim, not
// the bucket's configuration, not a purge), the log owner's request
// subjects, publishing deltas, answering aborts, and its own inbox. It may
// not read deltas (other conversations' tokens), publish doorbells or
// aborts, nor touch any other stream. An external broker's operator gives
// a worker's user the same (docs/security.md).
func WorkerPermissions(ns Namespace) *server.Permissions {
	ns = ns.orDefault()
	stream, cons, kv := ns.StreamName(), ns.ConsumerName(), "KV_"+ns.leaseBucket()
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO." + stream,
			"$JS.API.CONSUMER.INFO." + stream + "." + cons,
			"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + cons,
			"$JS.API.STREAM.INFO." + kv,
			"$JS.API.STREAM.MSG.GET." + kv,
			"$JS.API.DIRECT.GET." + kv + ".>",
			// One token: session lease keys are base64url, the claim key
			// ("namespace.owner") has two.
			"$KV." + ns.leaseBucket() + ".*",
			ns.LogSubject("*"),
			ns.deltaWildcard(),
		}},
		Subscribe: &server.SubjectPermission{Allow: []string{
			ns.AbortSubject(),
			WorkerInboxPrefix + ".>",
		}},
		// Answers to the owner's abort requests, one per request.
		Response: &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute},
	}
}

// Credentials are what a client presents to the broker, and the CA that
// proves the broker's certificate. All empty: an unauthenticated
// connection over plain TCP (a broker on loopback, or one that has no
// users).
type Credentials struct {
	User, Password string
	// Token is a bare authorization token (a broker's `authorization {
	// token }`), used when User is empty.
	Token string
	// CredsFile is a NATS .creds file (a user JWT and its nkey seed), for
	// a broker run with an operator and accounts.
	CredsFile string
	// NkeySeedFile is a file holding a user nkey seed (SU...).
	NkeySeedFile string
	// TLSCA is a PEM file of the CA that signed the broker's certificate;
	// TLS is used when it is set or the URL is tls://.
	TLSCA string
}

// ErrCredentials: credentials given in a way that cannot work (a password
// without a user, a file that cannot be read).
var ErrCredentials = errors.New("nats credentials")

// ReadSecret is the trimmed content of a file holding one secret (a
// password, a token): never the secret on a command line, where ps shows it.
func ReadSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrCredentials, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%w: %s is empty", ErrCredentials, path)
	}
	return s, nil
}

// options are nats.go's options for c.
func (c Credentials) options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	case c.Password != "":
		return nil, fmt.Errorf("%w: a password without a user", ErrCredentials)
	case c.Token != "":
		opts = append(opts, nats.Token(c.Token))
	}
	if c.CredsFile != "" {
		if _, err := os.Stat(c.CredsFile); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCredentials, err)
		}
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.NkeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(c.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nkey seed %s: %v", ErrCredentials, c.NkeySeedFile, err)
		}
		opts = append(opts, o)
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	return opts, nil
}

// ConnectWith is Connect with credentials. A worker's connection takes
// its replies under WorkerInboxPrefix, the one inbox its role may read.
// logger, if not nil, is told why a connection attempt failed (refused
// credentials, an untrusted certificate) and of permission refusals:
// Connect keeps retrying, so without it a wrong password is silence.
func ConnectWith(url string, c Credentials, worker bool, logger *slog.Logger) (*nats.Conn, error) {
	opts, err := c.options()
	if err != nil {
		return nil, err
	}
	if worker {
		opts = append(opts, nats.CustomInboxPrefix(WorkerInboxPrefix))
	}
	if logger != nil {
		var mu sync.Mutex
		last := ""
		// Once per distinct reason: attempts repeat every 250 ms.
		say := func(msg string, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err == nil || err.Error() == last {
				return
			}
			last = err.Error()
			logger.Warn(msg, "url", url, "err", err)
		}
		opts = append(opts,
			nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { say("nats: cannot connect; retrying", err) }),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { say("nats: refused", err) }),
		)
	}
	return connect(url, opts...)
}

// brokerAuth sets the embedded server's users and TLS. A broker that
// listens for TCP has two users, the owner (a random password, used by the
// in-process connection) and, when a worker password is given, the
// worker; every connection must be one of them. One that does not listen
// needs none: only this process can reach it.
func brokerAuth(opts *server.Options, o EmbeddedOptions) (ownerPassword string, err error) {
	if o.Listen == "" || o.Open {
		return "", nil
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("embedded nats: owner password: %w", err)
	}
	ownerPassword = hex.EncodeToString(b[:])
	opts.Users = []*server.User{{Username: OwnerUser, Password: ownerPassword}}
	if o.WorkerPassword != "" {
		opts.Users = append(opts.Users, &server.User{
			Username: WorkerUser, Password: o.WorkerPassword,
			Permissions: WorkerPermissions(o.Namespace),
		})
	}
	if o.TLSCert != "" || o.TLSKey != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: o.TLSCert, KeyFile: o.TLSKey})
		if err != nil {
			return "", fmt.Errorf("embedded nats: tls: %w", err)
		}
		opts.TLSConfig, opts.TLS = tc, true
		opts.TLSTimeout = 2
	}
	return ownerPassword, nil
}

// BindStream is the submissions consumer as a worker sees it: looked up,
// never created or changed (the owner does that, EnsureStream), so that
// the worker's role needs no right to change streams. Not found until the
// owner has started; the caller retries.
func BindStream(ctx context.Context, js jetstream.JetStream, ns Namespace) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, ns.StreamName(), ns.ConsumerName())
	if err != nil {
		return nil, fmt.Errorf("consumer %s of stream %s (created by the log's owner, `convlog serve`): %w", ns.ConsumerName(), ns.StreamName(), err)
	}
	return cons, nil
}

// BindLeases is OpenLeases for a worker: the bucket is looked up, never
// created or changed (the owner's remote server does that).
func BindLeases(ctx context.Context, js jetstream.JetStream, ns Namespace, ttl time.Duration, folder string) (*Leases, error) {
	kv, err := js.KeyValue(ctx, ns.leaseBucket())
	if err != nil {
		return nil, fmt.Errorf("lease bucket %s (created by the log's owner, `convlog serve`): %w", ns.leaseBucket(), err)
	}
	return &Leases{kv: kv, ttl: ttl, owner: []byte(leaseOwner(folder)), folder: folder + " "}, nil
}

// LeaseOwner is the name a process whose log instance id is folder holds
// its leases by: what a remote worker presents to the log's owner with
// its reads, so that the owner can tell a lease holder from anyone else.
func LeaseOwner(folder string) string { return leaseOwner(folder) }
