package transport_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/convlog/convlog/internal/auth"
)

// TestOperationsRoutesAccess: with access control on, /metrics and
// /admin/backup need the admin scope (401 without a token, 403 with
// another), and /openapi.json is public. The backup streams the log with
// its exact length.
func TestOperationsRoutesAccess(t *testing.T) {
	a := staticTokens(t, map[string][]string{"ops": {"admin"}, "reader": {"read:*/*"}})
	var e *env
	e = newEnv(t, withAuth(a, auth.Limits{}), func(o *envConfig) {
		o.Metrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "convlog_up 1\n") })
		o.Backup = backupFunc(func(ctx context.Context, begin func(int64) (io.Writer, error)) (int64, error) {
			return e.db.Backup(ctx, begin)
		})
	})
	for _, tc := range []struct {
		method, path string
	}{{http.MethodGet, "/metrics"}, {http.MethodPost, "/admin/backup"}} {
		for who, want := range map[string]int{"": http.StatusUnauthorized, "reader": http.StatusForbidden, "ops": http.StatusOK} {
			hdr := map[string]string{}
			if who != "" {
				hdr["Authorization"] = "Bearer " + who
			}
			st, h, body := e.do(t, tc.method, tc.path, nil, hdr)
			if st != want {
				t.Errorf("%s %s as %q: %d %s, want %d", tc.method, tc.path, who, st, body, want)
			}
			if st == http.StatusOK && tc.path == "/admin/backup" {
				if n, _ := strconv.Atoi(h.Get("Content-Length")); n != len(body) || n == 0 || !bytes.Contains(body, []byte("streams")) {
					t.Errorf("backup: Content-Length %s, %d bytes", h.Get("Content-Length"), len(body))
				}
			}
		}
	}
	if st, _, _ := e.do(t, http.MethodGet, "/openapi.json", nil, nil); st != http.StatusOK {
		t.Errorf("/openapi.json without a token: %d", st)
	}
}
