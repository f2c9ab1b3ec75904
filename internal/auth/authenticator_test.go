package auth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/goleak"

	"github.com/convlog/convlog/internal/check"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testIssuer   = "https://idp.test/"
	testAudience = "convlog"
	testSecret   = "0123456789abcdef0123456789abcdef-hs256"
)

// signer is a key a test signs with, and its JWK.
type signer struct {
	kid  string
	alg  jwt.SigningMethod
	priv crypto.Signer
}

func newRSA(t *testing.T, kid string) signer {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid, jwt.SigningMethodRS256, k}
}

func newEC(t *testing.T, kid string) signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid, jwt.SigningMethodES256, k}
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func (s signer) jwk() map[string]any {
	switch pub := s.priv.Public().(type) {
	case *rsa.PublicKey:
		return map[string]any{"kty": "RSA", "kid": s.kid, "alg": "RS256", "use": "sig",
			"n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes())}
	case *ecdsa.PublicKey:
		ecdh, _ := pub.ECDH()
		raw := ecdh.Bytes() // 0x04 || X || Y
		return map[string]any{"kty": "EC", "kid": s.kid, "alg": "ES256", "use": "sig", "crv": "P-256",
			"x": b64(raw[1:33]), "y": b64(raw[33:])}
	}
	panic("unknown key")
}

func jwks(signers ...signer) []byte {
	var keys []map[string]any
	for _, s := range signers {
		keys = append(keys, s.jwk())
	}
	b, _ := json.Marshal(map[string]any{"keys": keys})
	return b
}

func claims(sub string, mutate func(jwt.MapClaims)) jwt.MapClaims {
	now := time.Now()
	c := jwt.MapClaims{"iss": testIssuer, "aud": testAudience, "sub": sub,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "scope": "read:support/{sub} deliver:support/{sub}"}
	if mutate != nil {
		mutate(c)
	}
	return c
}

func (s signer) sign(t *testing.T, c jwt.MapClaims) string {
	tok := jwt.NewWithClaims(s.alg, c)
	tok.Header["kid"] = s.kid
	out, err := tok.SignedString(s.priv)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hs256(t *testing.T, secret string, c jwt.MapClaims) string {
	out, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func getenv(k string) string {
	if k == "CONVLOG_JWT_SECRET" {
		return testSecret
	}
	return ""
}

// rotatingJWKS serves a key set that the test replaces.
type rotatingJWKS struct {
	mu    sync.Mutex
	body  []byte
	calls int
}

func (r *rotatingJWKS) set(b []byte) { r.mu.Lock(); r.body = b; r.mu.Unlock() }

func (r *rotatingJWKS) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	w.Header().Set("Content-Type", "application/json")
	w.Write(r.body)
}

func newAuth(t *testing.T, cfg Config, opts Options) *Authenticator {
	t.Helper()
	if opts.Getenv == nil {
		opts.Getenv = getenv
	}
	a, err := New(context.Background(), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

func TestStaticTokens(t *testing.T) {
	sum := sha256.Sum256([]byte("s3cret-token"))
	a := newAuth(t, Config{Tokens: []TokenConfig{{SHA256: hex.EncodeToString(sum[:]), Principal: "ops", Scopes: []string{"admin", "read:*/*"}}}}, Options{})
	p, err := a.Authenticate(context.Background(), "s3cret-token")
	if err != nil || p.Subject != "ops" || !p.Allows(VerbAdmin, "", "") || !p.Allows(VerbRead, "a", "b") || p.Allows(VerbDeliver, "a", "b") {
		t.Fatalf("static token: %+v, %v", p, err)
	}
	for _, bad := range []string{"", "s3cret-token ", "other", hex.EncodeToString(sum[:])} {
		if _, err := a.Authenticate(context.Background(), bad); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Authenticate(%q) = %v, want ErrUnauthorized", bad, err)
		}
	}
}

func TestJWT(t *testing.T) {
	rs, es := newRSA(t, "rs-1"), newEC(t, "es-1")
	srv := &rotatingJWKS{body: jwks(rs, es)}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := newAuth(t, Config{JWT: &JWTConfig{Issuer: testIssuer, Audience: testAudience,
		HS256SecretEnv: "CONVLOG_JWT_SECRET", JWKS: ts.URL}}, Options{MinRefresh: time.Millisecond})
	ctx := context.Background()

	for name, tok := range map[string]string{
		"RS256": rs.sign(t, claims("alice", nil)),
		"ES256": es.sign(t, claims("alice", nil)),
		"HS256": hs256(t, testSecret, claims("alice", nil)),
	} {
		p, err := a.Authenticate(ctx, tok)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if p.Issuer != testIssuer || p.Subject != "alice" || !p.Allows(VerbRead, "support", "alice") || p.Allows(VerbRead, "support", "bob") || p.Expires.IsZero() {
			t.Errorf("%s: principal %+v", name, p)
		}
	}

	other := newRSA(t, "rs-1") // same kid, another key: a forged signature
	bad := map[string]string{
		"expired":        rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() })),
		"no exp":         rs.sign(t, claims("alice", func(c jwt.MapClaims) { delete(c, "exp") })),
		"not yet valid":  rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() })),
		"wrong audience": rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["aud"] = "someone-else" })),
		"wrong issuer":   rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["iss"] = "https://evil.test/" })),
		"bad signature":  other.sign(t, claims("alice", nil)),
		"wrong secret":   hs256(t, "another-secret-of-at-least-32-bytes!!", claims("alice", nil)),
		"no sub":         rs.sign(t, claims("", nil)),
		"bad scope":      rs.sign(t, claims("alice", func(c jwt.MapClaims) { c["scope"] = "write:everything" })),
		"alg none":       noneToken(t, claims("alice", nil)),
		"malformed":      "a.b.c",
		// Algorithm confusion: an HS256 token keyed with the RSA public
		// key's bytes must not verify against the key set.
		"HS256 with the public key": hs256(t, string(rsaPublicBytes(rs)), claims("alice", nil)),
	}
	for name, tok := range bad {
		if p, err := a.Authenticate(ctx, tok); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: accepted as %+v (err %v)", name, p, err)
		}
	}

	// Scopes as an array, from a configured claim.
	b := newAuth(t, Config{JWT: &JWTConfig{Issuer: testIssuer, Audience: testAudience, HS256SecretEnv: "CONVLOG_JWT_SECRET", ScopesClaim: "perms"}}, Options{})
	p, err := b.Authenticate(ctx, hs256(t, testSecret, claims("bob", func(c jwt.MapClaims) { c["perms"] = []string{"manage:support/*"} })))
	if err != nil || !p.Allows(VerbManage, "support", "x") || p.Allows(VerbRead, "support", "bob") {
		t.Errorf("array scopes: %+v, %v", p, err)
	}
}

func noneToken(t *testing.T, c jwt.MapClaims) string {
	s, err := jwt.NewWithClaims(jwt.SigningMethodNone, c).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func rsaPublicBytes(s signer) []byte { return s.priv.Public().(*rsa.PublicKey).N.Bytes() }

// A key rotation at the identity provider is picked up without a restart:
// a token signed with a key the set did not hold makes the authenticator
// fetch the set again.
func TestJWKSURLRotation(t *testing.T) {
	old, next := newRSA(t, "k1"), newEC(t, "k2")
	srv := &rotatingJWKS{body: jwks(old)}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := newAuth(t, Config{JWT: &JWTConfig{Issuer: testIssuer, Audience: testAudience, JWKS: ts.URL}},
		Options{MinRefresh: time.Millisecond, RefreshInterval: time.Hour})
	ctx := context.Background()
	if _, err := a.Authenticate(ctx, old.sign(t, claims("alice", nil))); err != nil {
		t.Fatalf("old key: %v", err)
	}
	if _, err := a.Authenticate(ctx, next.sign(t, claims("alice", nil))); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("a key not yet published was accepted: %v", err)
	}
	srv.set(jwks(next)) // rotate: the old key is withdrawn
	// The refresh is rate limited, not timed: each failed call may start one.
	check.For(t, 30*time.Second, 5*time.Millisecond, func() error {
		if _, err := a.Authenticate(ctx, next.sign(t, claims("alice", nil))); err != nil {
			return fmt.Errorf("the rotated key was never picked up: %w", err)
		}
		return nil
	})
	// The withdrawn key stops working once the set has been re-read.
	if _, err := a.Authenticate(ctx, old.sign(t, claims("alice", nil))); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("a withdrawn key still verifies: %v", err)
	}
}

func TestJWKSFileRotation(t *testing.T) {
	old, next := newEC(t, "f1"), newRSA(t, "f2")
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(path, jwks(old), 0o600); err != nil {
		t.Fatal(err)
	}
	a := newAuth(t, Config{JWT: &JWTConfig{Issuer: testIssuer, Audience: testAudience, JWKS: path}}, Options{})
	ctx := context.Background()
	if _, err := a.Authenticate(ctx, old.sign(t, claims("alice", nil))); err != nil {
		t.Fatalf("file key: %v", err)
	}
	if err := os.WriteFile(path, jwks(old, next), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, next.sign(t, claims("alice", nil))); err != nil {
		t.Fatalf("a key added to the file was not picked up: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	good := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	for name, c := range map[string]Config{
		"short hash":  {Tokens: []TokenConfig{{SHA256: "abc", Principal: "p"}}},
		"upper hash":  {Tokens: []TokenConfig{{SHA256: "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08", Principal: "p"}}},
		"duplicate":   {Tokens: []TokenConfig{{SHA256: good, Principal: "p"}, {SHA256: good, Principal: "q"}}},
		"no name":     {Tokens: []TokenConfig{{SHA256: good}}},
		"bad scope":   {Tokens: []TokenConfig{{SHA256: good, Principal: "p", Scopes: []string{"rd:*/*"}}}},
		"no issuer":   {JWT: &JWTConfig{Audience: "a", JWKS: "x"}},
		"no audience": {JWT: &JWTConfig{Issuer: "i", JWKS: "x"}},
		"no keys":     {JWT: &JWTConfig{Issuer: "i", Audience: "a"}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(context.Background(), Config{JWT: &JWTConfig{Issuer: "i", Audience: "a", HS256SecretEnv: "SHORT"}},
		Options{Getenv: func(string) string { return "short" }}); err == nil {
		t.Error("a short HS256 secret was accepted")
	}
}

func FuzzAuthenticate(f *testing.F) {
	sum := sha256.Sum256([]byte("tok"))
	a, err := New(context.Background(), Config{
		Tokens: []TokenConfig{{SHA256: hex.EncodeToString(sum[:]), Principal: "p", Scopes: []string{"read:*/*"}}},
		JWT:    &JWTConfig{Issuer: testIssuer, Audience: testAudience, HS256SecretEnv: "CONVLOG_JWT_SECRET"},
	}, Options{Getenv: getenv})
	if err != nil {
		f.Fatal(err)
	}
	defer a.Close()
	f.Add("tok")
	f.Add("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.x")
	f.Add("a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, token string) {
		p, err := a.Authenticate(context.Background(), token)
		if err != nil {
			if !errors.Is(err, ErrUnauthorized) {
				t.Fatalf("error %v is not ErrUnauthorized", err)
			}
			return
		}
		if token != "tok" && p.Issuer != testIssuer {
			t.Fatalf("%q accepted as %+v", token, p)
		}
	})
}
