package natsbus

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Credentials that cannot work are refused at start, saying why, not left
// to a broker that answers every attempt with a refusal.
func TestCredentialsRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    Credentials
		ok   bool
	}{
		{"nothing", Credentials{}, true},
		{"user and password", Credentials{User: "worker", Password: "pw"}, true},
		{"token", Credentials{Token: "tok"}, true},
		{"a password without a user", Credentials{Password: "pw"}, false},
		{"a missing creds file", Credentials{CredsFile: filepath.Join(dir, "none.creds")}, false},
		{"a missing nkey seed", Credentials{NkeySeedFile: filepath.Join(dir, "none.nk")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.options()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrCredentials)) {
				t.Fatalf("options: %v, want ok=%v", err, tc.ok)
			}
		})
	}
	if _, err := ReadSecret(empty); !errors.Is(err, ErrCredentials) {
		t.Fatalf("an empty secret file: %v, want ErrCredentials", err)
	}
	if _, err := ReadSecret(filepath.Join(dir, "none")); !errors.Is(err, ErrCredentials) {
		t.Fatalf("a missing secret file: %v, want ErrCredentials", err)
	}
}
