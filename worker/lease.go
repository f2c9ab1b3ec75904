package worker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	clog "github.com/convlog/convlog/log"
)

// ErrLeaseHeld: another worker runs a turn of the session now.
var ErrLeaseHeld = errors.New("session lease held by another worker")

// DefaultLeaseTTL is how long a dead holder keeps a session's lease.
const DefaultLeaseTTL = 15 * time.Second

// leases are per-session locks in a JetStream key-value bucket whose
// entries expire TTL after their last write. A holder renews its lease
// while its turn runs; if it dies, the lease lapses and another worker (in
// this process or another) may run the session's next turn. The bucket is
// the one place all workers on a broker agree on, which an in-process mutex
// is not.
type leases struct {
	kv    jetstream.KeyValue
	ttl   time.Duration
	owner []byte // "host pid start-ulid"
	host  string
}

func openLeases(ctx context.Context, js jetstream.JetStream, ns Namespace, ttl time.Duration) (*leases, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:  ns.leaseBucket(),
		TTL:     ttl,
		Storage: jetstream.FileStorage,
		History: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("lease bucket %s: %w", ns.leaseBucket(), err)
	}
	host, _ := os.Hostname()
	owner := host + " " + strconv.Itoa(os.Getpid()) + " " + ulid.Make().String()
	liveOwners.Store(owner, true)
	return &leases{kv: kv, ttl: ttl, owner: []byte(owner), host: host}, nil
}

// liveOwners are the lease owners of this process's pools: several pools
// may share a process (and so a pid), and only those not here are dead.
var liveOwners sync.Map

// deadOwner reports whether a lease's owner is a process of this host that
// no longer runs (or an earlier life of this very process id): its lease
// can be taken at once instead of waiting for it to lapse, which matters
// after a kill -9 and restart.
func (l *leases) deadOwner(owner []byte) bool {
	f := strings.Fields(string(owner))
	if len(f) != 3 || f[0] != l.host {
		return false
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || pid <= 0 {
		return false
	}
	if pid == os.Getpid() {
		_, live := liveOwners.Load(string(owner))
		return !live
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// leaseKey encodes a session key into the bucket's key alphabet.
func leaseKey(k clog.Key) string { return base64.RawURLEncoding.EncodeToString([]byte(k.String())) }

// lease is a held session lease.
type lease struct {
	l   *leases
	key string
	rev uint64
}

// acquire takes the session's lease, or returns ErrLeaseHeld.
func (l *leases) acquire(ctx context.Context, k clog.Key) (*lease, error) {
	key := leaseKey(k)
	rev, err := l.kv.Create(ctx, key, l.owner)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := l.kv.Get(ctx, key)
		if gerr != nil || !l.deadOwner(e.Value()) {
			return nil, ErrLeaseHeld
		}
		// Only if it is still the dead owner's: a live worker may have
		// taken it meanwhile.
		if err := l.kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
			return nil, ErrLeaseHeld
		}
		rev, err = l.kv.Create(ctx, key, l.owner)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, ErrLeaseHeld
		}
	}
	if err != nil {
		return nil, fmt.Errorf("acquire lease %s: %w", k, err)
	}
	return &lease{l: l, key: key, rev: rev}, nil
}

// keep renews the lease every TTL/3 until ctx ends. If a renewal fails the
// lease may lapse, and another worker could start the session; lost is
// called so the turn stops rather than run beside another.
func (ls *lease) keep(ctx context.Context, lost func(error)) {
	t := time.NewTicker(ls.l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, ls.l.ttl/3)
			rev, err := ls.l.kv.Update(rctx, ls.key, ls.l.owner, ls.rev)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					lost(fmt.Errorf("renew lease: %w", err))
				}
				return
			}
			ls.rev = rev
		}
	}
}

// release gives the lease up, if it is still ours.
func (ls *lease) release(ctx context.Context) error {
	if err := ls.l.kv.Delete(ctx, ls.key, jetstream.LastRevision(ls.rev)); err != nil {
		return fmt.Errorf("release lease: %w", err)
	}
	return nil
}
