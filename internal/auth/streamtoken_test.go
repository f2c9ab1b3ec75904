package auth

import (
	"errors"
	"testing"
	"time"
)

func TestStreamTokens(t *testing.T) {
	st, err := NewStreamTokens(nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c := Conversation{"support", "alice", "default"}
	tok, exp := st.Issue(Principal{Issuer: "iss", Subject: "alice", Expires: now.Add(time.Minute)}, c, now, StreamTokenTTL)
	if !exp.Equal(now.Add(time.Minute)) {
		t.Errorf("a stream token outlives its principal's token: %v", exp)
	}
	p, err := st.Verify(tok, c, now)
	if err != nil || p.Subject != "alice" || !p.Allows(VerbRead, "support", "alice") || p.Allows(VerbDeliver, "support", "alice") || p.Allows(VerbRead, "support", "bob") {
		t.Fatalf("Verify: %+v, %v", p, err)
	}
	other, _ := NewStreamTokens(nil)
	for name, check := range map[string]func() error{
		"expired":        func() error { _, err := st.Verify(tok, c, now.Add(2*time.Minute)); return err },
		"other session":  func() error { _, err := st.Verify(tok, Conversation{"support", "alice", "s2"}, now); return err },
		"other key":      func() error { _, err := other.Verify(tok, c, now); return err },
		"no prefix":      func() error { _, err := st.Verify(tok[len(StreamTokenPrefix):], c, now); return err },
		"truncated":      func() error { _, err := st.Verify(tok[:len(tok)-5], c, now); return err },
		"bearer-looking": func() error { _, err := st.Verify("eyJ.x.y", c, now); return err },
	} {
		if err := check(); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: %v, want ErrUnauthorized", name, err)
		}
	}
	if _, err := NewStreamTokens([]byte("short")); err == nil {
		t.Error("a short key was accepted")
	}
}
