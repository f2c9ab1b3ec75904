package egress_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/convlog/convlog/worker/egress"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		addr                 string
		strict, allowPrivate bool // allowed under each
	}{
		{"93.184.215.14", true, true},
		{"2606:4700::6810:85e5", true, true},
		{"169.254.169.254", false, false},
		{"::ffff:169.254.169.254", false, false},
		{"64:ff9b::a9fe:a9fe", false, false}, // NAT64 of 169.254.169.254
		{"169.254.1.1", false, false},
		{"fd00:ec2::254", false, false},
		{"100.100.100.200", false, false},
		{"168.63.129.16", false, false},
		{"fe80::1", false, false},
		{"0.0.0.0", false, false},
		{"0.1.2.3", false, false},
		{"::", false, false},
		{"224.0.0.1", false, false},
		{"ff02::1", false, false},
		{"255.255.255.255", false, false},
		{"127.0.0.1", false, true},
		{"127.0.0.2", false, true},
		{"::1", false, true},
		{"::ffff:127.0.0.1", false, true},
		{"10.1.2.3", false, true},
		{"172.16.0.1", false, true},
		{"192.168.1.1", false, true},
		{"100.64.0.1", false, true},
		{"fd12::1", false, true},
		{"64:ff9b::a00:1", false, true}, // NAT64 of 10.0.0.1
	} {
		ip := netip.MustParseAddr(tc.addr)
		for _, p := range []struct {
			policy egress.Policy
			want   bool
		}{{egress.Policy{}, tc.strict}, {egress.Policy{AllowPrivate: true}, tc.allowPrivate}} {
			err := p.policy.Check(ip)
			if (err == nil) != p.want || (err != nil && !errors.Is(err, egress.ErrRefused)) {
				t.Errorf("%s, allowPrivate %v: %v", tc.addr, p.policy.AllowPrivate, err)
			}
		}
	}
}

// Control is what the dialer calls with the resolved address, before the
// connection is made.
func TestControl(t *testing.T) {
	for _, tc := range []struct {
		network, address string
		wantErr          string
	}{
		{"tcp4", "169.254.169.254:80", "cloud metadata"},
		{"tcp6", "[fd00:ec2::254]:80", "cloud metadata"},
		{"tcp4", "127.0.0.1:8080", "loopback"},
		{"tcp4", "93.184.215.14:443", ""},
		{"tcp", "not-an-address", "egress refused"},
	} {
		err := egress.Policy{}.Control(tc.network, tc.address, nil)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, egress.ErrRefused)) {
			t.Errorf("%s %s: %v", tc.network, tc.address, err)
		}
	}
}

// dnsServer answers every A query with ip, every other query with no
// answer: a name the test controls, resolved by the real resolver.
func dnsServer(t *testing.T, ip netip.Addr) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			end := 12
			for end < n && q[end] != 0 {
				end += int(q[end]) + 1
			}
			end += 5 // the name's last 0, qtype, qclass
			if end > n {
				continue
			}
			a := binary.BigEndian.Uint16(q[end-4:]) == 1
			resp := append([]byte{}, q[:2]...)
			resp = append(resp, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0)
			resp = append(resp, q[12:end]...)
			if a {
				resp[7] = 1
				v4 := ip.As4()
				resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
				resp = append(resp, v4[:]...)
			}
			pc.WriteTo(resp, from)
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// A name that resolves to a refused address is refused at connect time:
// the check is on what the name resolved to, not on the URL.
func TestResolvedAddressRefused(t *testing.T) {
	t.Run("metadata", func(t *testing.T) {
		c := egress.Policy{AllowPrivate: true, Resolver: dnsServer(t, netip.MustParseAddr("169.254.169.254"))}.Client()
		_, err := c.Get("http://metadata.convlog.test/latest/meta-data/")
		if !errors.Is(err, egress.ErrRefused) || !strings.Contains(err.Error(), "169.254.169.254 is a cloud metadata address") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("loopback", func(t *testing.T) {
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			io.WriteString(w, "ok")
		}))
		defer srv.Close()
		port := srv.Listener.Addr().(*net.TCPAddr).Port
		url := "http://internal.convlog.test:" + strconv.Itoa(port) + "/"
		r := dnsServer(t, netip.MustParseAddr("127.0.0.1"))
		_, err := egress.Policy{Resolver: r}.Client().Get(url)
		if !errors.Is(err, egress.ErrRefused) || hits.Load() != 0 {
			t.Fatalf("strict: %v, %d requests", err, hits.Load())
		}
		resp, err := egress.Policy{Resolver: r, AllowPrivate: true}.Client().Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if hits.Load() != 1 {
			t.Fatalf("allowPrivate: %d requests", hits.Load())
		}
	})
}

func TestCheckRedirect(t *testing.T) {
	req := func(u string) *http.Request {
		r, _ := http.NewRequest(http.MethodPost, u, nil)
		return r
	}
	for _, tc := range []struct {
		from, to string
		ok       bool
	}{
		{"http://a.example/x", "http://a.example/y", true},
		{"http://a.example/x", "http://a.example:80/y", true},
		{"https://a.example/x", "https://a.example:443/y", true},
		{"http://a.example/x", "http://b.example/y", false},
		{"http://a.example/x", "https://a.example/y", false},
		{"https://a.example/x", "http://a.example/y", false},
		{"http://a.example/x", "http://a.example:8080/y", false},
		{"http://127.0.0.1:1/x", "http://127.0.0.2:1/y", false},
	} {
		err := egress.CheckRedirect(req(tc.to), []*http.Request{req(tc.from)})
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, egress.ErrRefused)) {
			t.Errorf("%s -> %s: %v", tc.from, tc.to, err)
		}
	}
	via := []*http.Request{req("http://a/"), req("http://a/"), req("http://a/"), req("http://a/"), req("http://a/")}
	if err := egress.CheckRedirect(req("http://a/"), via); !errors.Is(err, egress.ErrRefused) {
		t.Errorf("a sixth redirect: %v", err)
	}
}
