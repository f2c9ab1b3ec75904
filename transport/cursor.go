package transport

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
)

// cursorSeal makes the instances listing's cursors opaque. The log's
// cursor is its index key (agent, activity time, instance name): handed
// out as is, it would name an instance and its activity to anyone holding
// it, and a page's cursor may sit on a row its caller may not see. Sealed
// (AES-GCM, the agent as additional data), it says nothing and cannot be
// forged or moved to another agent.
type cursorSeal struct{ aead cipher.AEAD }

// errBadCursor is a cursor this server did not seal.
var errBadCursor = errors.New("transport: not a cursor of this server")

// newCursorSeal keys the seal from the stream token key, so that nodes
// sharing it accept each other's cursors; without one, a random key:
// cursors then open on this process only, as stream tokens do.
func newCursorSeal(secret []byte) (*cursorSeal, error) {
	var key [32]byte
	if len(secret) > 0 {
		key = sha256.Sum256(append([]byte("convlog instances cursor\x00"), secret...))
	} else if _, err := rand.Read(key[:]); err != nil {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	block, err := aes.NewCipher(key[:])
	if err != nil {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	return &cursorSeal{aead: aead}, nil
}

func (cs *cursorSeal) seal(agent, raw string) string {
	if raw == "" {
		return ""
	}
	nonce := make([]byte, cs.aead.NonceSize(), cs.aead.NonceSize()+len(raw)+cs.aead.Overhead())
	_, _ = rand.Read(nonce) // crypto/rand.Read does not fail
	return base64.RawURLEncoding.EncodeToString(cs.aead.Seal(nonce, nonce, []byte(raw), []byte(agent)))
}

func (cs *cursorSeal) open(agent, sealed string) (string, error) {
	if sealed == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil || len(b) < cs.aead.NonceSize() {
		return "", errBadCursor
	}
	raw, err := cs.aead.Open(nil, b[:cs.aead.NonceSize()], b[cs.aead.NonceSize():], []byte(agent))
	if err != nil {
		return "", errBadCursor
	}
	return string(raw), nil
}
