// Package egress is the address and redirect policy of the HTTP requests
// convlog makes on its own (agent endpoints, tool calls, and later
// webhooks): a URL convlog was told to call must not become a way into the
// machine's cloud metadata, its link-local neighbours or, unless allowed,
// the private network it runs in.
//
// The address check runs in the dialer's Control function, on the address
// actually being connected to after DNS resolution, so that a name that
// resolves (or is rebound) to a refused address is refused too. Redirects
// are followed only within the request's origin (scheme, host and port):
// a cross-origin redirect would re-send the request, its body and its
// headers (an API key) somewhere the configuration never named.
//
// The package imports only the standard library: agent authors import the
// worker packages that use it.
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// ErrRefused is wrapped by every refusal of this package: a destination
// address or a redirect the policy does not allow.
var ErrRefused = errors.New("egress refused")

// CodeRefused is the failure code of a turn whose agent endpoint was
// refused by the policy: not retryable, since only a configuration change
// makes it pass.
const CodeRefused = "egress_refused"

// maxRedirects bounds a chain of same-origin redirects.
const maxRedirects = 5

// Policy says where outbound requests may connect. The zero Policy is the
// strict one: public addresses only.
type Policy struct {
	// AllowPrivate allows loopback (127.0.0.0/8, ::1) and private networks
	// (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7). Link-local,
	// metadata, unspecified and multicast addresses stay refused.
	AllowPrivate bool
	// Resolver resolves host names; nil is net.DefaultResolver.
	Resolver *net.Resolver
}

// RefusedError is a destination address the policy refuses.
type RefusedError struct {
	Addr   netip.Addr
	Reason string // e.g. "a link-local address"
	Hint   string // what would allow it, "" when nothing does
}

func (e *RefusedError) Error() string {
	s := fmt.Sprintf("egress: %s is %s", e.Addr, e.Reason)
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s
}

func (e *RefusedError) Unwrap() error { return ErrRefused }

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

var (
	// Cloud metadata services. Some sit inside ranges AllowPrivate opens
	// (fd00:ec2::254 in fc00::/7, 100.100.100.200 in 100.64/10), and
	// Azure's 168.63.129.16 is a public address: each is refused by name.
	metadata = prefixes("169.254.169.254/32", "fd00:ec2::254/128", "100.100.100.200/32", "168.63.129.16/32")
	// Never a destination a configured URL means: "this network" (0.0.0.0
	// connects to the local host on Linux), link-local, multicast,
	// reserved and broadcast.
	never = prefixes("0.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4", "::/128", "fe80::/10", "ff00::/8")
	// Private networks, opened by AllowPrivate.
	private = prefixes("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
	// NAT64's well-known prefix embeds an IPv4 address in its last 32 bits.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
)

// Check says whether the policy allows connecting to ip.
func (p Policy) Check(ip netip.Addr) error {
	ip = ip.Unmap()
	if nat64.Contains(ip) {
		b := ip.As16()
		var inner *RefusedError
		if errors.As(p.Check(netip.AddrFrom4([4]byte(b[12:]))), &inner) {
			return &RefusedError{Addr: ip, Reason: "the NAT64 form of " + inner.Addr.String() + ", " + inner.Reason, Hint: inner.Hint}
		}
		return nil
	}
	in := func(ps []netip.Prefix) bool {
		for _, pr := range ps {
			if pr.Contains(ip) {
				return true
			}
		}
		return false
	}
	switch {
	case !ip.IsValid():
		return &RefusedError{Addr: ip, Reason: "not an address"}
	case in(metadata):
		return &RefusedError{Addr: ip, Reason: "a cloud metadata address"}
	case in(never):
		return &RefusedError{Addr: ip, Reason: "a link-local, unspecified, multicast or reserved address"}
	case !p.AllowPrivate && in(private):
		kind := "a private address"
		if ip.IsLoopback() {
			kind = "a loopback address"
		}
		return &RefusedError{Addr: ip, Reason: kind, Hint: "allowPrivate allows it"}
	}
	return nil
}

// Control is a net.Dialer Control function: it refuses a connection to an
// address the policy does not allow, after resolution and before the
// connection is made.
func (p Policy) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("egress: %s address %q: %w", network, address, ErrRefused)
	}
	return p.Check(ap.Addr())
}

// Dialer is a dialer that applies the policy to every connection.
func (p Policy) Dialer() *net.Dialer {
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Resolver: p.Resolver, Control: p.Control}
}

// Transport is an http.Transport that applies the policy. It uses no
// proxy from the environment: a proxy connects to the destination in
// convlog's place, where its address could not be checked.
func (p Policy) Transport() *http.Transport {
	return &http.Transport{
		DialContext:           p.Dialer().DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// Client is an http.Client that applies the policy and follows redirects
// only within the request's origin. It has no timeout: the request's
// context bounds it.
func (p Policy) Client() *http.Client {
	return &http.Client{Transport: p.Transport(), CheckRedirect: CheckRedirect}
}

// CheckRedirect is an http.Client CheckRedirect function that follows a
// redirect only to the origin (scheme, host and port) of the first
// request, at most 5 times.
func CheckRedirect(req *http.Request, via []*http.Request) error {
	first := via[0].URL
	if origin(req.URL) != origin(first) {
		return fmt.Errorf("egress: redirect from %s://%s to %s://%s: only same-origin redirects are followed: %w",
			first.Scheme, first.Host, req.URL.Scheme, req.URL.Host, ErrRefused)
	}
	if len(via) >= maxRedirects {
		return fmt.Errorf("egress: stopped after %d redirects: %w", maxRedirects, ErrRefused)
	}
	return nil
}

// origin is scheme://host:port, with the scheme's default port made
// explicit so that http://h and http://h:80 are one origin.
func origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), port)
}
