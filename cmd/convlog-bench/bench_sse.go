package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// benchSSE is the bench's lean SSE reader: one TCP connection, one
// goroutine (the caller's), a small buffer, no JSON decoding. Ten thousand
// of them fit in one load-generator process; what they measure is the
// server, not the client's parsing.
type benchSSE struct {
	conn  net.Conn
	body  *bufio.Reader
	bytes int64 // bytes read off the socket, headers and chunk framing included
	long  []byte
}

type benchCountingConn struct {
	net.Conn
	n *int64
}

func (c benchCountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	*c.n += int64(n)
	return n, err
}

// openBenchSSE sends GET path over HTTP/1.1 and reads the response head. The
// body is dechunked by net/http's reader.
func openBenchSSE(ctx context.Context, addr, path string, bufSize int) (*benchSSE, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &benchSSE{conn: conn}
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\nUser-Agent: convlog-bench\r\n\r\n", path, addr); err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReaderSize(benchCountingConn{conn, &c.bytes}, bufSize)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		conn.Close()
		return nil, fmt.Errorf("stream %s: status %d: %s", path, resp.StatusCode, b)
	}
	_ = conn.SetReadDeadline(time.Time{})
	if resp.Body == http.NoBody || resp.ContentLength == 0 {
		conn.Close()
		return nil, fmt.Errorf("stream %s: empty body", path)
	}
	c.body = bufio.NewReaderSize(resp.Body, bufSize)
	return c, nil
}

func (c *benchSSE) Close() error { return c.conn.Close() }

// line returns the next line without its end; valid until the next call.
func (c *benchSSE) line() ([]byte, error) {
	b, err := c.body.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		c.long = append(c.long[:0], b...)
		for errors.Is(err, bufio.ErrBufferFull) {
			b, err = c.body.ReadSlice('\n')
			c.long = append(c.long, b...)
		}
		b = c.long
	}
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSuffix(b[:len(b)-1], []byte("\r"))
	return b, nil
}

// benchSSEEvent is one event: its id (if any) and its data, valid until the
// next call; a comment has only comment set.
type benchSSEEvent struct {
	id      []byte
	data    []byte
	comment bool
}

// next reads one event or comment. It handles the one-data-line events
// the servers under test write (multi-line data is joined with '\n').
func (c *benchSSE) next(ev *benchSSEEvent) error {
	ev.id, ev.data, ev.comment = ev.id[:0], ev.data[:0], false
	hasData := false
	for {
		l, err := c.line()
		if err != nil {
			return err
		}
		if len(l) == 0 {
			if hasData {
				return nil
			}
			continue
		}
		switch {
		case l[0] == ':':
			if !hasData {
				ev.comment = true
				return nil
			}
		case bytes.HasPrefix(l, []byte("data:")):
			if hasData {
				ev.data = append(ev.data, '\n')
			}
			ev.data = append(ev.data, bytes.TrimPrefix(l[5:], []byte(" "))...)
			hasData = true
		case bytes.HasPrefix(l, []byte("id:")):
			ev.id = append(ev.id, bytes.TrimPrefix(l[3:], []byte(" "))...)
		}
	}
}

var (
	benchTSKey       = []byte(`"timestamp":"`)
	benchConvPrefix  = []byte(`{"type":"conversation"`)
	benchDeltaPrefix = []byte(`{"type":"delta"`)
)

// benchFirstTimestamp finds the first record's timestamp in a frame's data
// without decoding the frame.
func benchFirstTimestamp(data []byte) (time.Time, bool) {
	i := bytes.Index(data, benchTSKey)
	if i < 0 {
		return time.Time{}, false
	}
	rest := data[i+len(benchTSKey):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(rest[:j]))
	return t, err == nil
}
