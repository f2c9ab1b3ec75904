package transport

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// streamConn is what an sseWriter needs of its connection besides writing:
// a *http.ResponseController, or a connection taken from net/http.
type streamConn interface {
	Flush() error
	SetWriteDeadline(time.Time) error
}

// hijacked is a connection taken from net/http: what is written to it is
// sent at once, so Flush has nothing to do.
type hijacked struct{ net.Conn }

func (hijacked) Flush() error { return nil }

// hijackStream takes the stream's connection from net/http and writes the
// response head with header h. The body that follows is the stream, ended
// by closing the connection (Connection: close, no chunked framing). It
// returns an error wrapping http.ErrNotSupported when the connection cannot
// be taken (the stream is then served through net/http), and another when
// the client is already gone.
func (s *Server) hijackStream(w http.ResponseWriter, h http.Header) (net.Conn, error) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, err
	}
	// net/http's deadlines were for the request; the stream sets its own
	// per write, and reads only to learn that the client left.
	_ = conn.SetReadDeadline(time.Time{})
	var head bytes.Buffer
	head.WriteString("HTTP/1.1 200 OK\r\n")
	h.Set(echo.HeaderConnection, "close")
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	_ = h.Write(&head) // a bytes.Buffer does not fail
	head.WriteString("\r\n")
	_ = conn.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout))
	if _, err := conn.Write(head.Bytes()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("stream head: %w", err)
	}
	return conn, nil
}

// watchPeer reads conn until it fails, which is how a stream learns that
// its client left (an SSE client sends nothing after its request), then
// calls gone. The returned channel closes when the reading goroutine is
// done: after conn is closed at the latest.
func watchPeer(conn net.Conn, gone context.CancelFunc) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer gone()
		var b [64]byte
		for {
			if _, err := conn.Read(b[:]); err != nil {
				return
			}
		}
	}()
	return done
}
