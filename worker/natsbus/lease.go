package natsbus

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/convlog/convlog/log/record"
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
type Leases struct {
	kv    jetstream.KeyValue
	ttl   time.Duration
	owner []byte // "<folder instance id> <boot nonce>"
	// folder is the log's instance id and a space: the prefix of the
	// leases of every process that has held this data folder.
	folder string
}

// OpenLeases opens the namespace's lease bucket for the data folder whose
// log has instance id folder (log.DB.InstanceID).
func OpenLeases(ctx context.Context, js jetstream.JetStream, ns Namespace, ttl time.Duration, folder string) (*Leases, error) {
	return OpenLeasesReplicas(ctx, js, ns, ttl, folder, 1)
}

// OpenLeasesReplicas is OpenLeases with the bucket kept on replicas servers
// of a NATS cluster (below 1 is 1).
func OpenLeasesReplicas(ctx context.Context, js jetstream.JetStream, ns Namespace, ttl time.Duration, folder string, replicas int) (*Leases, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:   ns.leaseBucket(),
		TTL:      ttl,
		Storage:  jetstream.FileStorage,
		History:  1,
		MaxBytes: LeaseBucketMaxBytes,
		Replicas: replicasOrUnset(replicas),
	})
	if err != nil {
		return nil, fmt.Errorf("lease bucket %s: %w", ns.leaseBucket(), err)
	}
	return &Leases{kv: kv, ttl: ttl, owner: []byte(leaseOwner(folder)), folder: folder + " "}, nil
}

// bootNonce tells this process from earlier ones that held the same data
// folder. Pools of one process share it: their leases are all live.
var bootNonce = ulid.Make().String()

func leaseOwner(folder string) string { return folder + " " + bootNonce }

// predecessor reports whether a lease is held by an earlier process of this
// data folder: the folder's instance id with another boot nonce. The log's
// file lock admits one process per folder, and this one holds it, so that
// process is dead and its lease can be taken at once instead of waiting
// for it to lapse, which matters after a kill -9 and restart. Any other
// owner (another folder, this process, a form we do not know) may be alive
// whatever its host or pid say, and is waited out.
func (l *Leases) predecessor(owner []byte) bool {
	nonce, ok := strings.CutPrefix(string(owner), l.folder)
	return ok && l.folder != " " && nonce != "" && nonce != bootNonce && !strings.Contains(nonce, " ")
}

// leaseKey encodes a session key into the bucket's key alphabet.
func leaseKey(k record.Key) string { return base64.RawURLEncoding.EncodeToString([]byte(k.String())) }

// lease is a held session lease.
type Lease struct {
	l   *Leases
	key string
	rev uint64
}

// acquire takes the session's lease, or returns ErrLeaseHeld.
func (l *Leases) Acquire(ctx context.Context, k record.Key) (*Lease, error) {
	key := leaseKey(k)
	rev, err := l.kv.Create(ctx, key, l.owner)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := l.kv.Get(ctx, key)
		if gerr != nil || !l.predecessor(e.Value()) {
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
	return &Lease{l: l, key: key, rev: rev}, nil
}

// Keep renews the lease every TTL/3 until ctx ends. A renewal that fails
// for want of the broker (a leader election, a reconnect) is retried, for
// as long as the lease has not lapsed; lost is called, so that the turn
// stops rather than run beside another, when the lease is someone else's
// now or the retries have run out of TTL.
func (ls *Lease) Keep(ctx context.Context, lost func(error)) {
	every := ls.l.ttl / 3
	t := time.NewTimer(every)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Give up with a margin before the broker's own expiry, so that a
		// turn is stopped before another worker may take the session.
		left := time.Until(renewed.Add(ls.l.ttl - ls.l.ttl/5))
		if left <= 0 {
			lost(errors.New("renew lease: no renewal succeeded within the lease's TTL"))
			return
		}
		rctx, cancel := context.WithTimeout(ctx, min(every, left))
		rev, err := ls.l.kv.Update(rctx, ls.key, ls.l.owner, ls.rev)
		cancel()
		switch {
		case err == nil:
			ls.rev, renewed = rev, time.Now()
			t.Reset(every)
		case ctx.Err() != nil:
			return
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			// A renewal whose ack was lost (in a leader election) may have
			// been stored all the same: the lease is still ours if it
			// holds our name.
			if e, gerr := ls.l.kv.Get(ctx, ls.key); gerr == nil && string(e.Value()) == string(ls.l.owner) {
				ls.rev = e.Revision()
				t.Reset(time.Millisecond)
				continue
			} else if gerr != nil && !errors.Is(gerr, jetstream.ErrKeyNotFound) && !errors.Is(gerr, jetstream.ErrKeyDeleted) {
				t.Reset(min(250*time.Millisecond, max(left/4, time.Millisecond)))
				continue
			}
			lost(fmt.Errorf("renew lease: %w", err))
			return
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			lost(fmt.Errorf("renew lease: %w", err))
			return
		default:
			t.Reset(min(250*time.Millisecond, max(left/4, time.Millisecond)))
		}
	}
}

// Owner is the holder's name as stored in the lease bucket: what the log's
// owner compares to fence a remote worker's writes.
func (ls *Lease) Owner() string { return string(ls.l.owner) }

// Holder is the name stored in the session's lease, "" when it is free.
func (l *Leases) Holder(ctx context.Context, k record.Key) (string, error) {
	e, err := l.kv.Get(ctx, leaseKey(k))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("lease of %s: %w", k, err)
	}
	return string(e.Value()), nil
}

// release gives the lease up, if it is still ours.
func (ls *Lease) Release(ctx context.Context) error {
	if err := ls.l.kv.Delete(ctx, ls.key, jetstream.LastRevision(ls.rev)); err != nil {
		return fmt.Errorf("release lease: %w", err)
	}
	return nil
}
