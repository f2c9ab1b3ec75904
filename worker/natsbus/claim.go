package natsbus

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNamespaceInUse: another data folder's process works in this NATS
// namespace. Two logs behind one stream and one consumer would take each
// other's doorbells and contend for each other's session names, so the
// second is refused; each data folder needs a namespace of its own.
var ErrNamespaceInUse = errors.New("nats namespace in use by another data folder")

// claimKey is the namespace claim's key in the lease bucket. Session lease
// keys are base64url, which never holds a '.'.
const claimKey = "namespace.owner"

// Claim is this data folder's hold on the namespace: a key of the lease
// bucket, with the lease owner form, renewed like a lease, so that it
// lapses a TTL after its process dies.
type Claim struct {
	l   *Leases
	ns  Namespace
	rev uint64
}

// ClaimNamespace takes the namespace for this data folder, or returns
// ErrNamespaceInUse naming the folder that has it. A claim of this folder
// (a dead predecessor, or another pool of this process) is taken over.
func (l *Leases) ClaimNamespace(ctx context.Context, ns Namespace) (*Claim, error) {
	for {
		rev, err := l.kv.Create(ctx, claimKey, l.owner)
		if err == nil {
			return &Claim{l: l, ns: ns, rev: rev}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("claim nats namespace: %w", err)
		}
		e, err := l.kv.Get(ctx, claimKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("claim nats namespace: %w", err)
		}
		if !l.ours(e.Value()) {
			folder, _, _ := strings.Cut(string(e.Value()), " ")
			return nil, fmt.Errorf("%w: namespace %q is used by the convlog of data folder %s (this is %s): give each data folder its own --nats-namespace (if that process was killed rather than stopped, its claim lapses within %s)",
				ErrNamespaceInUse, string(ns.orDefault()), folder, strings.TrimSpace(l.folder), l.ttl)
		}
		rev, err = l.kv.Update(ctx, claimKey, l.owner, e.Revision())
		if err == nil {
			return &Claim{l: l, ns: ns, rev: rev}, nil
		}
		// Changed meanwhile: look again.
	}
}

// ours reports whether a claim or lease value is of this data folder.
func (l *Leases) ours(owner []byte) bool {
	return l.folder != " " && strings.HasPrefix(string(owner), l.folder)
}

// Renew rewrites the claim, keeping it from lapsing. It returns
// ErrNamespaceInUse if another folder has taken it meanwhile (this process
// could not renew for a TTL, a broker partition).
func (c *Claim) Renew(ctx context.Context) error {
	rev, err := c.l.kv.Update(ctx, claimKey, c.l.owner, c.rev)
	if err == nil {
		c.rev = rev
		return nil
	}
	// Lapsed, or renewed by another pool of this folder: claim it again.
	again, err := c.l.ClaimNamespace(ctx, c.ns)
	if err != nil {
		return err
	}
	c.rev = again.rev
	return nil
}

// Release gives the claim up, if it is still ours.
func (c *Claim) Release(ctx context.Context) error {
	if err := c.l.kv.Delete(ctx, claimKey, jetstream.LastRevision(c.rev)); err != nil {
		return fmt.Errorf("release nats namespace claim: %w", err)
	}
	return nil
}
