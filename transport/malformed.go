package transport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/log/record"
)

// net/http answers a request it cannot parse itself, before any handler
// runs, with one write on the connection of exactly this form (server.go,
// conn.serve): a status line, these headers, and a short text. No handler
// response has it: those always carry Date and a length or chunking.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// maxHeadCapture is how much of the bytes read since the last response a
// connection keeps, to say what was wrong with a request net/http refused:
// enough for a request line and the usual headers, and held only between
// a request's first byte and its response.
const maxHeadCapture = 4 << 10

// jsonErrorListener wraps the connections of Serve so that net/http's own
// plain-text refusals become the API's JSON errors.
type jsonErrorListener struct {
	net.Listener
	maxHeaderBytes int
}

func (l jsonErrorListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &jsonErrorConn{Conn: c, maxHeaderBytes: l.maxHeaderBytes}, nil
}

type jsonErrorConn struct {
	net.Conn
	maxHeaderBytes int

	mu   sync.Mutex // Read (also net/http's background read) and Write race
	head []byte     // the start of what was read since the last write
}

func (c *jsonErrorConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if room := maxHeadCapture - len(c.head); room > 0 {
			c.head = append(c.head, p[:min(n, room)]...)
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *jsonErrorConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	head := c.head
	c.head = nil // a response: what follows is another request
	c.mu.Unlock()
	if b, ok := rewriteNetHTTPError(p, head, c.maxHeaderBytes); ok {
		if _, err := c.Conn.Write(b); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// CloseWrite lets net/http half-close after its 431, as it does on a bare
// TCP connection.
func (c *jsonErrorConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// rewriteNetHTTPError turns one of net/http's own refusals into a JSON
// error response; ok is false for anything else, written as it is.
func rewriteNetHTTPError(p, head []byte, maxHeaderBytes int) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !ok {
		return nil, false
	}
	i := bytes.Index(rest, []byte(netHTTPErrorHeaders))
	if i < 0 || bytes.ContainsAny(rest[:i], "\r\n") {
		return nil, false
	}
	statusLine, text := string(rest[:i]), string(rest[i+len(netHTTPErrorHeaders):])
	code, err := strconv.Atoi(strings.SplitN(statusLine, " ", 2)[0])
	if err != nil {
		return nil, false
	}
	e := describeNetHTTPError(code, statusLine, text, head, maxHeaderBytes)
	body, err := json.Marshal(errorBody{e})
	if err != nil {
		return nil, false
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		e.Status, http.StatusText(e.Status), echo.MIMEApplicationJSON, len(body))
	b.Write(body)
	return b.Bytes(), true
}

// describeNetHTTPError says, as precisely as what was read allows, what
// net/http refused. Every one is a client's mistake, so a 4xx: net/http's
// 501 for a transfer coding and 505 for a version become 400.
func describeNetHTTPError(code int, statusLine, text string, head []byte, maxHeaderBytes int) *wire.APIError {
	switch code {
	case http.StatusRequestHeaderFieldsTooLarge:
		return apiErr(code, wire.CodeHeadersTooLarge, "the request's headers are larger than %d bytes", maxHeaderBytes)
	case http.StatusNotImplemented:
		return apiErr(http.StatusBadRequest, wire.CodeUnsupportedTransferEncoding,
			"the request's Transfer-Encoding is not supported: send the body with a Content-Length, or chunked")
	case http.StatusHTTPVersionNotSupported:
		return apiErr(http.StatusBadRequest, wire.CodeMalformedRequest, "the request's HTTP version is not supported (HTTP/1.0 and HTTP/1.1 are)")
	}
	// "400 Bad Request: missing required Host header" carries its reason.
	if _, reason, ok := strings.Cut(statusLine, ": "); ok {
		return apiErr(http.StatusBadRequest, wire.CodeMalformedRequest, "the request is not valid HTTP: %s", reason)
	}
	if reason := diagnoseHead(head); reason != "" {
		return apiErr(http.StatusBadRequest, wire.CodeMalformedRequest, "the request is not valid HTTP: %s", reason)
	}
	return apiErr(http.StatusBadRequest, wire.CodeMalformedRequest,
		"the request is not valid HTTP/1.1: a malformed request line, URL (a bad %% escape) or header, or a bad or repeated Content-Length")
}

// diagnoseHead finds, in the start of a refused request, the faults
// net/http refuses without saying which: a URL that does not parse, a
// Content-Length that is not a number or is given twice with different
// values. "" when it cannot tell.
func diagnoseHead(head []byte) string {
	end := bytes.Index(head, []byte("\r\n\r\n"))
	if end < 0 {
		return ""
	}
	lines := strings.Split(string(head[:end]), "\r\n")
	if parts := strings.Split(lines[0], " "); len(parts) == 3 {
		if _, err := url.ParseRequestURI(parts[1]); err != nil {
			if ue, ok := err.(*url.Error); ok {
				err = ue.Err
			}
			return fmt.Sprintf("the URL is malformed: %v", err)
		}
	}
	var lengths []string
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if ok && textproto.CanonicalMIMEHeaderKey(name) == "Content-Length" {
			lengths = append(lengths, textproto.TrimString(value))
		}
	}
	for i, v := range lengths {
		if n, err := strconv.ParseUint(v, 10, 63); err != nil || strconv.FormatUint(n, 10) != v {
			return fmt.Sprintf("Content-Length %q is not a length", record.Clip(v, 40))
		}
		if i > 0 && v != lengths[0] {
			return "Content-Length is given more than once, with different values"
		}
	}
	return ""
}

// checkQuery refuses a query string that does not parse (a bad % escape, a
// ';' separator): echo would drop the broken parameter silently, and a
// reader's session or offset would quietly become the default.
func checkQuery(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if _, err := url.ParseQuery(c.Request().URL.RawQuery); err != nil {
			return apiErr(http.StatusBadRequest, wire.CodeMalformedRequest, "the query string is malformed: %v", err)
		}
		return next(c)
	}
}
