//go:build unix

package transport_test

import (
	"context"
	"net"
	"syscall"
	"testing"
)

// dialSmallBuffer connects with a small receive buffer, so that what the
// server writes and the client does not read fills the socket quickly.
func dialSmallBuffer(t testing.TB, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}
