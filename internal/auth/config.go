package auth

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Config is the auth section of convlog.yaml.
type Config struct {
	// Tokens are static bearer tokens, each stored as the SHA-256 of the
	// token (hex), never the token itself.
	Tokens []TokenConfig `yaml:"tokens"`
	// JWT accepts bearer JWTs of one issuer.
	JWT *JWTConfig `yaml:"jwt"`
	// Limits apply to each principal separately.
	Limits Limits `yaml:"limits"`
}

// Limits bound what one principal may do, whatever its scopes allow.
type Limits struct {
	// DeliveriesPerSecond is the token-bucket rate of deliveries; 0 is no
	// limit. Burst is the bucket's size (default: one second's worth,
	// at least 1).
	DeliveriesPerSecond float64 `yaml:"deliveriesPerSecond"`
	Burst               int     `yaml:"burst"`
	// Streams caps the principal's open SSE streams; 0 is no cap.
	Streams int `yaml:"streams"`
}

// TokenConfig is one static token.
type TokenConfig struct {
	SHA256    string   `yaml:"sha256"`
	Principal string   `yaml:"principal"`
	Scopes    []string `yaml:"scopes"`
}

// JWTConfig says which JWTs are accepted.
type JWTConfig struct {
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// HS256SecretEnv names the environment variable holding the HS256
	// shared secret (the secret never sits in the file).
	HS256SecretEnv string `yaml:"hs256SecretEnv"`
	// JWKS is a URL (https:// or http://) or a file path of the key set
	// for RS256 and ES256 tokens.
	JWKS string `yaml:"jwks"`
	// ScopesClaim is the claim holding the scopes: a space-separated
	// string or an array of strings. Default "scope".
	ScopesClaim string `yaml:"scopesClaim"`
}

// Enabled reports whether the section configures any way in.
func (c Config) Enabled() bool { return len(c.Tokens) > 0 || c.JWT != nil }

// Validate checks the section without touching the network or the
// environment; errors name the field.
func (c Config) Validate() error {
	seen := map[string]bool{}
	for i, t := range c.Tokens {
		field := fmt.Sprintf("auth.tokens[%d]", i)
		b, err := hex.DecodeString(t.SHA256)
		if err != nil || len(b) != 32 || strings.ToLower(t.SHA256) != t.SHA256 {
			return fmt.Errorf("%s.sha256: want 64 lowercase hex digits (sha256sum of the token)", field)
		}
		if seen[t.SHA256] {
			return fmt.Errorf("%s.sha256: the same token is listed twice", field)
		}
		seen[t.SHA256] = true
		if t.Principal == "" {
			return fmt.Errorf("%s.principal: required", field)
		}
		if _, err := ParseScopes(t.Scopes); err != nil {
			return fmt.Errorf("%s.scopes: %w", field, err)
		}
	}
	if l := c.Limits; l.DeliveriesPerSecond < 0 || l.Burst < 0 || l.Streams < 0 {
		return errors.New("auth.limits: deliveriesPerSecond, burst and streams must not be negative")
	}
	if j := c.JWT; j != nil {
		switch {
		case j.Issuer == "":
			return errors.New("auth.jwt.issuer: required")
		case j.Audience == "":
			return errors.New("auth.jwt.audience: required")
		case j.HS256SecretEnv == "" && j.JWKS == "":
			return errors.New("auth.jwt: give hs256SecretEnv, jwks or both")
		}
	}
	return nil
}
