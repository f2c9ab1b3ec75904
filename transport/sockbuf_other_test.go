//go:build !unix

package transport_test

import (
	"net"
	"testing"
)

// dialSmallBuffer connects; the default buffers only make the tests that
// fill them need larger pages.
func dialSmallBuffer(t testing.TB, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}
