package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// StreamTokenPrefix begins every stream token, so it is never mistaken for
// (or tried as) a bearer token.
const StreamTokenPrefix = "cst_"

// StreamTokenTTL is how long a stream token opens streams; a stream opened
// with one ends when it expires (the client asks for a new one).
const StreamTokenTTL = 10 * time.Minute

// StreamTokens issues and verifies short-lived, read-only tokens for one
// conversation (agent, instance, session), for browsers' EventSource,
// which cannot send an Authorization header and so must put a token in the
// URL. URLs end up in logs, histories and Referer headers: only a token
// that expires in minutes and reads one conversation may travel there,
// never the caller's long-lived credentials.
type StreamTokens struct {
	key []byte
}

// NewStreamTokens signs with key (at least 32 bytes); nil draws a random
// key, valid for this process only.
func NewStreamTokens(key []byte) (*StreamTokens, error) {
	if key == nil {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
	}
	if len(key) < 32 {
		return nil, fmt.Errorf("stream token key: %d bytes, want at least 32", len(key))
	}
	return &StreamTokens{key: key}, nil
}

// streamClaims is the signed payload.
type streamClaims struct {
	Issuer   string `json:"iss,omitempty"`
	Subject  string `json:"sub"`
	Agent    string `json:"a"`
	Instance string `json:"i"`
	Session  string `json:"s"`
	Expires  int64  `json:"exp"`
}

// Conversation names what a stream token reads.
type Conversation struct{ Agent, Instance, Session string }

// Issue makes a token for p to read c until now+ttl (at most p's own
// expiry).
func (st *StreamTokens) Issue(p Principal, c Conversation, now time.Time, ttl time.Duration) (token string, expires time.Time) {
	expires = now.Add(ttl)
	if !p.Expires.IsZero() && p.Expires.Before(expires) {
		expires = p.Expires
	}
	payload, _ := json.Marshal(streamClaims{p.Issuer, p.Subject, c.Agent, c.Instance, c.Session, expires.Unix()})
	body := base64.RawURLEncoding.EncodeToString(payload)
	return StreamTokenPrefix + body + "." + base64.RawURLEncoding.EncodeToString(st.mac(body)), expires
}

func (st *StreamTokens) mac(body string) []byte {
	m := hmac.New(sha256.New, st.key)
	m.Write([]byte(body))
	return m.Sum(nil)
}

// Verify checks a stream token for reading c at now: the principal it
// stands for, with the one scope it grants.
func (st *StreamTokens) Verify(token string, c Conversation, now time.Time) (Principal, error) {
	rest, ok := strings.CutPrefix(token, StreamTokenPrefix)
	if !ok || len(token) > 2048 {
		return Principal{}, fmt.Errorf("%w: not a stream token", ErrUnauthorized)
	}
	body, sig, ok := strings.Cut(rest, ".")
	if !ok {
		return Principal{}, fmt.Errorf("%w: malformed stream token", ErrUnauthorized)
	}
	want, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(want, st.mac(body)) {
		return Principal{}, fmt.Errorf("%w: bad stream token signature", ErrUnauthorized)
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: malformed stream token", ErrUnauthorized)
	}
	var cl streamClaims
	if err := json.Unmarshal(raw, &cl); err != nil {
		return Principal{}, fmt.Errorf("%w: malformed stream token", ErrUnauthorized)
	}
	exp := time.Unix(cl.Expires, 0)
	if !now.Before(exp) {
		return Principal{}, fmt.Errorf("%w: stream token expired", ErrUnauthorized)
	}
	if (Conversation{cl.Agent, cl.Instance, cl.Session}) != c {
		return Principal{}, fmt.Errorf("%w: the stream token is for another conversation", ErrUnauthorized)
	}
	return Principal{Issuer: cl.Issuer, Subject: cl.Subject, Expires: exp,
		Scopes: []Scope{{Verb: VerbRead, Agent: cl.Agent, Instance: cl.Instance}}}, nil
}
