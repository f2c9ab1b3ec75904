package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// ErrUnauthorized: no credentials, or credentials that prove nothing
// (malformed, expired, not yet valid, bad signature, unknown token, wrong
// issuer or audience). The wrapped message says which, for the log; the
// client is told only that it is unauthorized.
var ErrUnauthorized = errors.New("unauthorized")

// Authenticator verifies bearer tokens. Close releases its JWKS refresher.
type Authenticator struct {
	static map[string]Principal // by SHA-256 hex of the token

	jwt         *JWTConfig
	hsSecret    []byte
	remoteKeys  keyfunc.Keyfunc // JWKS from a URL, refreshed
	fileKeys    *fileKeySet     // JWKS from a file, re-read when it changes
	scopesClaim string
	parser      *jwt.Parser

	stop      context.CancelFunc
	closeOnce sync.Once
}

// Options are the parts of New's behaviour that tests and operators tune.
type Options struct {
	// HTTPClient fetches a JWKS URL; nil is a client with a 10 s timeout.
	HTTPClient *http.Client
	// RefreshInterval re-fetches a JWKS URL; 0 is 10 minutes. A token
	// signed with a key the set does not hold also triggers a fetch, at
	// most every MinRefresh (0 is 5 s), so a rotation is picked up at once.
	RefreshInterval time.Duration
	MinRefresh      time.Duration
	// Getenv reads the HS256 secret's variable; nil is os.Getenv.
	Getenv func(string) string
	// Leeway tolerates clock skew on exp and nbf; 0 is 30 s.
	Leeway time.Duration
}

// New builds an Authenticator from a validated Config.
func New(ctx context.Context, cfg Config, opts Options) (*Authenticator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Authenticator{static: map[string]Principal{}}
	for _, t := range cfg.Tokens {
		scopes, _ := ParseScopes(t.Scopes)
		a.static[t.SHA256] = Principal{Subject: t.Principal, Scopes: scopes}
	}
	j := cfg.JWT
	if j == nil {
		return a, nil
	}
	a.jwt = j
	a.scopesClaim = j.ScopesClaim
	if a.scopesClaim == "" {
		a.scopesClaim = "scope"
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	var algs []string
	if j.HS256SecretEnv != "" {
		secret := getenv(j.HS256SecretEnv)
		if len(secret) < 32 {
			return nil, fmt.Errorf("auth.jwt.hs256SecretEnv: $%s must hold a secret of at least 32 bytes", j.HS256SecretEnv)
		}
		a.hsSecret = []byte(secret)
		algs = append(algs, "HS256")
	}
	if j.JWKS != "" {
		algs = append(algs, "RS256", "ES256")
		kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		a.stop = cancel
		if strings.HasPrefix(j.JWKS, "https://") || strings.HasPrefix(j.JWKS, "http://") {
			client := opts.HTTPClient
			if client == nil {
				client = &http.Client{Timeout: 10 * time.Second}
			}
			refresh, minRefresh := opts.RefreshInterval, opts.MinRefresh
			if refresh <= 0 {
				refresh = 10 * time.Minute
			}
			if minRefresh <= 0 {
				minRefresh = 5 * time.Second
			}
			k, err := keyfunc.NewDefaultOverrideCtx(kctx, []string{j.JWKS}, keyfunc.Override{
				Client:            client,
				RefreshInterval:   refresh,
				RefreshUnknownKID: rate.NewLimiter(rate.Every(minRefresh), 1),
				HTTPTimeout:       10 * time.Second,
			})
			if err != nil {
				cancel()
				return nil, fmt.Errorf("auth.jwt.jwks: %w", err)
			}
			a.remoteKeys = k
		} else {
			fk, err := openFileKeySet(j.JWKS)
			if err != nil {
				cancel()
				return nil, fmt.Errorf("auth.jwt.jwks: %w", err)
			}
			a.fileKeys = fk
		}
	}
	leeway := opts.Leeway
	if leeway == 0 {
		leeway = 30 * time.Second
	}
	a.parser = jwt.NewParser(
		jwt.WithValidMethods(algs),
		jwt.WithIssuer(j.Issuer),
		jwt.WithAudience(j.Audience),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(leeway),
	)
	return a, nil
}

// Close stops refreshing a JWKS URL. It is safe to call twice.
func (a *Authenticator) Close() {
	a.closeOnce.Do(func() {
		if a.stop != nil {
			a.stop()
		}
	})
}

// Enabled reports whether any token is accepted at all.
func (a *Authenticator) Enabled() bool { return a != nil && (len(a.static) > 0 || a.jwt != nil) }

// BearerToken extracts the token of an "Authorization: Bearer …" header
// value; "" when there is none.
func BearerToken(header string) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// Authenticate turns a bearer token into its Principal, or an error
// wrapping ErrUnauthorized.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (Principal, error) {
	if token == "" {
		return Principal{}, fmt.Errorf("%w: no bearer token", ErrUnauthorized)
	}
	if len(token) > 8192 {
		return Principal{}, fmt.Errorf("%w: token longer than 8192 bytes", ErrUnauthorized)
	}
	sum := sha256.Sum256([]byte(token))
	if p, ok := a.static[hex.EncodeToString(sum[:])]; ok {
		return p, nil
	}
	if a.jwt == nil || strings.Count(token, ".") != 2 {
		return Principal{}, fmt.Errorf("%w: unknown token", ErrUnauthorized)
	}
	claims := jwt.MapClaims{}
	tok, err := a.parser.ParseWithClaims(token, claims, a.keyFor(ctx))
	if err != nil || !tok.Valid {
		return Principal{}, fmt.Errorf("%w: %v", ErrUnauthorized, err)
	}
	sub, _ := claims.GetSubject()
	if sub == "" {
		return Principal{}, fmt.Errorf("%w: the token has no sub", ErrUnauthorized)
	}
	scopes, err := ParseScopes(scopeClaim(claims[a.scopesClaim]))
	if err != nil {
		return Principal{}, fmt.Errorf("%w: claim %s: %v", ErrUnauthorized, a.scopesClaim, err)
	}
	p := Principal{Issuer: a.jwt.Issuer, Subject: sub, Scopes: scopes}
	if exp, _ := claims.GetExpirationTime(); exp != nil {
		p.Expires = exp.Time
	}
	return p, nil
}

// keyFor picks the verification key by the token's algorithm: the shared
// secret for HS256, the key set for RS256 and ES256. An HS256 token is
// never checked against a public key (the classic algorithm confusion).
func (a *Authenticator) keyFor(ctx context.Context) jwt.Keyfunc {
	return func(t *jwt.Token) (any, error) {
		switch t.Method.Alg() {
		case "HS256":
			if a.hsSecret == nil {
				return nil, errors.New("HS256 is not configured")
			}
			return a.hsSecret, nil
		case "RS256", "ES256":
			switch {
			case a.remoteKeys != nil:
				return a.remoteKeys.KeyfuncCtx(ctx)(t)
			case a.fileKeys != nil:
				return a.fileKeys.keyfunc(ctx, t)
			}
			return nil, errors.New("no JWKS is configured")
		}
		return nil, fmt.Errorf("algorithm %s is not accepted", t.Method.Alg())
	}
}

// scopeClaim reads a space-separated string or an array of strings.
func scopeClaim(v any) []string {
	switch v := v.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		var out []string
		for _, e := range v {
			if str, ok := e.(string); ok {
				out = append(out, str)
			} else {
				out = append(out, fmt.Sprint(e)) // refused by ParseScope
			}
		}
		return out
	}
	return nil
}

// fileKeySet is a JWKS file, re-read when its modification time or size
// changes, so that an operator's key rotation is picked up without a
// restart.
type fileKeySet struct {
	path string

	mu   sync.Mutex
	mod  time.Time
	size int64
	keys keyfunc.Keyfunc
}

func openFileKeySet(path string) (*fileKeySet, error) {
	f := &fileKeySet{path: path}
	if err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *fileKeySet) reload() error {
	st, err := os.Stat(f.path)
	if err != nil {
		return err
	}
	if st.ModTime().Equal(f.mod) && st.Size() == f.size && f.keys != nil {
		return nil
	}
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return err
	}
	k, err := keyfunc.NewJWKSetJSON(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	f.keys, f.mod, f.size = k, st.ModTime(), st.Size()
	return nil
}

func (f *fileKeySet) keyfunc(ctx context.Context, t *jwt.Token) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key, err := f.keys.KeyfuncCtx(ctx)(t)
	if err == nil {
		return key, nil
	}
	// A key we do not hold: the file may have been rotated. A failed
	// reload keeps the keys we had.
	if rerr := f.reload(); rerr != nil {
		return nil, err
	}
	return f.keys.KeyfuncCtx(ctx)(t)
}
