package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
)

// writeAuthConfig writes a config file whose only content is access
// control: one static token with every verb on every conversation.
func writeAuthConfig(dir string) (path, token string, err error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	token = hex.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	path = filepath.Join(dir, "convlog.yaml")
	yaml := fmt.Sprintf(`auth:
  tokens:
    - sha256: %s
      principal: torture
      scopes: ["read:*/*", "deliver:*/*", "abort:*/*", "manage:*/*"]
`, hex.EncodeToString(sum[:]))
	return path, token, os.WriteFile(path, []byte(yaml), 0o600)
}

// bearer adds the token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// checkAuthOn makes sure the service under torture really refuses a
// request without the token: a run "with auth" that ran without it would
// prove nothing.
func (t *torture) checkAuthOn(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.base+"/agents/"+tortureAgent+"/"+t.instance+"/conversation?offset=0", nil)
	if err != nil {
		return err
	}
	resp, err := t.tr.RoundTrip(req) // the bare transport: no token
	if err != nil {
		return fmt.Errorf("torture: checking access control: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		return fmt.Errorf("torture: -auth, but a request without a token got %d, not 401", resp.StatusCode)
	}
	return nil
}
