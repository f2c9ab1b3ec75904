package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
)

// Client is a Go client of the API: what tests, benchmarks and other Go
// programs use to deliver messages and read conversations. The zero value
// with a BaseURL works.
type Client struct {
	// BaseURL is the server's root, like "http://127.0.0.1:8080".
	BaseURL string
	// HTTP is the client to use; nil means http.DefaultClient. Its Timeout,
	// if any, also bounds streams and long polls: prefer contexts.
	HTTP *http.Client
}

// maxErrorBody bounds what the client reads of an error response.
const maxErrorBody = 1 << 20

// MaxFrameLine bounds one line of an SSE stream the client parses; a
// conversation frame is one line, and a page of the log is at most 4 MiB
// of records (a single batch at most 16 MiB).
const MaxFrameLine = 16<<20 + 64<<10

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Client) url(agent, instance, suffix string, q url.Values) string {
	u := strings.TrimRight(c.BaseURL, "/") + wire.InstancePath(agent, instance) + suffix
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// do sends req and returns the response if its status is want; any other
// status is read as an *wire.APIError.
func (c *Client) do(req *http.Request, want int) (*http.Response, error) {
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		defer resp.Body.Close()
		return nil, readAPIError(resp)
	}
	return resp, nil
}

// readAPIError decodes an error response; a body not in the API's shape
// (a proxy's page, say) still gives an error with the status.
func readAPIError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var eb struct {
		Error *wire.APIError `json:"error"`
	}
	if json.Unmarshal(body, &eb) == nil && eb.Error != nil && eb.Error.Code != "" {
		eb.Error.Status = resp.StatusCode
		return eb.Error
	}
	return &wire.APIError{Status: resp.StatusCode, Code: "http_" + strconv.Itoa(resp.StatusCode),
		Message: strings.TrimSpace(record.Clip(string(body), 80))}
}

func decodeJSON(resp *http.Response, v any) error {
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("transport: decoding %s response: %w", resp.Request.URL.Path, err)
	}
	return nil
}

// Deliver posts a message. A Message.Kind left empty is sent as "user". A
// non-empty idempotencyKey makes a retry with the same request return the
// first admission.
func (c *Client) Deliver(ctx context.Context, agent, instance string, req wire.DeliverRequest, idempotencyKey string) (wire.Accepted, error) {
	if req.Message.Kind == "" {
		req.Message.Kind = "user"
	}
	body, err := json.Marshal(req)
	if err != nil {
		return wire.Accepted{}, fmt.Errorf("transport: encoding delivery: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(agent, instance, "", nil), bytes.NewReader(body))
	if err != nil {
		return wire.Accepted{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	if idempotencyKey != "" {
		hreq.Header.Set("Idempotency-Key", idempotencyKey)
	}
	resp, err := c.do(hreq, http.StatusAccepted)
	if err != nil {
		return wire.Accepted{}, err
	}
	var acc wire.Accepted
	return acc, decodeJSON(resp, &acc)
}

// Read reads one page of a session's stream from offset ("" means the
// start). limit 0 is the server's default.
func (c *Client) Read(ctx context.Context, agent, instance, session string, offset record.Offset, limit int) (record.ReadResult, error) {
	q := url.Values{}
	if session != "" {
		q.Set("session", session)
	}
	if offset != "" {
		q.Set("offset", string(offset))
	}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(agent, instance, "/conversation", q), nil)
	if err != nil {
		return record.ReadResult{}, err
	}
	resp, err := c.do(req, http.StatusOK)
	if err != nil {
		return record.ReadResult{}, err
	}
	var res record.ReadResult
	return res, decodeJSON(resp, &res)
}

// Submission returns a submission's state. A positive wait long-polls (at
// most MaxWait) until it is settled. The result's Key has the agent and
// instance; the wire form does not carry the session.
func (c *Client) Submission(ctx context.Context, agent, instance, id string, wait time.Duration) (record.Submission, error) {
	q := url.Values{}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	return c.submissionCall(ctx, http.MethodGet, agent, instance, "/submissions/"+url.PathEscape(id), q)
}

// Abort aborts a submission: see the abort route. A settled one is an
// *wire.APIError with code already_settled.
func (c *Client) Abort(ctx context.Context, agent, instance, id string) (record.Submission, error) {
	return c.submissionCall(ctx, http.MethodPost, agent, instance, "/submissions/"+url.PathEscape(id)+"/abort", nil)
}

// Decide answers the tool approvals a submission waits for
// (input_required, its Pending list): each decision is stored once, and
// the one that leaves nothing pending resumes the submission. A retry with
// the same idempotencyKey gets the first answer.
func (c *Client) Decide(ctx context.Context, agent, instance, id string, decisions []wire.Decision, idempotencyKey string) (wire.Decided, error) {
	body, err := json.Marshal(wire.DecideRequest{Decisions: decisions})
	if err != nil {
		return wire.Decided{}, fmt.Errorf("transport: encoding decisions: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(agent, instance, "/submissions/"+url.PathEscape(id)+"/approvals", nil), bytes.NewReader(body))
	if err != nil {
		return wire.Decided{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	if idempotencyKey != "" {
		hreq.Header.Set("Idempotency-Key", idempotencyKey)
	}
	resp, err := c.do(hreq, http.StatusAccepted)
	if err != nil {
		return wire.Decided{}, err
	}
	var d wire.Decided
	return d, decodeJSON(resp, &d)
}

func (c *Client) submissionCall(ctx context.Context, method, agent, instance, path string, q url.Values) (record.Submission, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url(agent, instance, path, q), nil)
	if err != nil {
		return record.Submission{}, err
	}
	resp, err := c.do(req, http.StatusOK)
	if err != nil {
		return record.Submission{}, err
	}
	var sub record.Submission
	if err := decodeJSON(resp, &sub); err != nil {
		return record.Submission{}, err
	}
	sub.Key = record.Key{Agent: agent, Instance: instance}
	return sub, nil
}

// Stream opens the SSE stream of a session from offset ("" means the
// start). Close the reader, or cancel ctx, to end it.
func (c *Client) Stream(ctx context.Context, agent, instance, session string, offset record.Offset) (*StreamReader, error) {
	return c.openStream(ctx, agent, instance, session, offset, "")
}

// Resume reopens a stream with the Last-Event-ID header, as a browser's
// EventSource does: lastEventID is a conversation frame's ID.
func (c *Client) Resume(ctx context.Context, agent, instance, session, lastEventID string) (*StreamReader, error) {
	return c.openStream(ctx, agent, instance, session, "", lastEventID)
}

func (c *Client) openStream(ctx context.Context, agent, instance, session string, offset record.Offset, lastEventID string) (*StreamReader, error) {
	q := url.Values{}
	if session != "" {
		q.Set("session", session)
	}
	if offset != "" {
		q.Set("offset", string(offset))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(agent, instance, "/stream", q), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := c.do(req, http.StatusOK)
	if err != nil {
		return nil, err
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		resp.Body.Close()
		return nil, fmt.Errorf("%w: the stream answered with %q", ErrNotEventStream, resp.Header.Get("Content-Type"))
	}
	return NewStreamReader(resp.Body), nil
}

// ErrNotEventStream is a stream request answered with something else
// than text/event-stream: something between the client and the server
// does not pass event streams.
var ErrNotEventStream = errors.New("client: not text/event-stream")

// Frame is one event of an SSE stream, or one comment.
type Frame struct {
	// ID is the event's own id: a conversation frame's next offset, the
	// value to resume from. Presentation frames have none.
	ID string
	// Type is the data's "type": wire.FrameConversation, wire.FrameError, or a
	// presentation frame's own (delta, toolcall_delta, ...). Empty for a
	// comment, and for data that is not a JSON object.
	Type string
	// Raw is the event's data.
	Raw json.RawMessage
	// Comment is the text of a comment line (": keepalive"), which is all
	// a comment frame has.
	Comment string

	// Of conversation frames: Offset and NextOffset are both the offset
	// after the batch, where to resume (equal to ID, and carried in the
	// frame's JSON, so that a client that does not see SSE ids resumes
	// from the data alone); BatchOffset is where the batch starts.
	Offset      record.Offset
	NextOffset  record.Offset
	BatchOffset record.Offset
	Incarnation record.Incarnation
	Records     []record.Record
}

// StreamReader parses a text/event-stream body.
type StreamReader struct {
	body    io.ReadCloser
	sc      *bufio.Scanner
	lastID  string
	stopped error // sticky: set after an error frame or a read error
}

// NewStreamReader reads SSE from body, which Close closes.
func NewStreamReader(body io.ReadCloser) *StreamReader {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxFrameLine)
	sc.Split(scanSSELines)
	return &StreamReader{body: body, sc: sc}
}

// Close ends the stream.
func (r *StreamReader) Close() error { return r.body.Close() }

// LastEventID is the id of the last event that had one: the offset from
// which Resume continues without loss or repetition.
func (r *StreamReader) LastEventID() string { return r.lastID }

// Next returns the next event or comment. An error frame is returned with
// an *wire.APIError (Status 0) describing it, after which the stream is over.
// The end of the stream is io.EOF.
func (r *StreamReader) Next() (Frame, error) {
	if r.stopped != nil {
		return Frame{}, r.stopped
	}
	var (
		f       Frame
		data    []byte
		hasData bool
		hasID   bool
	)
	for r.sc.Scan() {
		line := r.sc.Bytes()
		if len(line) == 0 { // end of an event
			if !hasData {
				hasID = false
				continue
			}
			f.Raw = json.RawMessage(bytes.Clone(data))
			if hasID {
				r.lastID = f.ID
			}
			return f, r.parse(&f)
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if len(field) == 0 { // a comment
			if !hasData && !hasID {
				return Frame{Comment: string(bytes.TrimPrefix(value, []byte(" ")))}, nil
			}
			continue
		}
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				f.ID, hasID = string(value), true
			}
		}
		// event, retry and unknown fields carry nothing this API uses.
	}
	if err := r.sc.Err(); err != nil {
		r.stopped = fmt.Errorf("transport: reading stream: %w", err)
		return Frame{}, r.stopped
	}
	r.stopped = io.EOF
	return Frame{}, io.EOF
}

// parse fills the typed fields of a data frame.
func (r *StreamReader) parse(f *Frame) error {
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(f.Raw, &head) != nil {
		return nil // not a JSON object: only Raw
	}
	f.Type = head.Type
	switch f.Type {
	case wire.FrameConversation:
		var c struct {
			Incarnation record.Incarnation `json:"incarnation"`
			Offset      record.Offset      `json:"offset"`
			NextOffset  record.Offset      `json:"nextOffset"`
			BatchOffset record.Offset      `json:"batchOffset"`
			Records     []record.Record    `json:"records"`
		}
		if err := json.Unmarshal(f.Raw, &c); err != nil {
			return fmt.Errorf("transport: conversation frame: %w", err)
		}
		f.Incarnation, f.Offset, f.NextOffset, f.BatchOffset, f.Records = c.Incarnation, c.Offset, c.NextOffset, c.BatchOffset, c.Records
	case wire.FrameError:
		e := &wire.APIError{}
		if err := json.Unmarshal(f.Raw, e); err != nil || e.Code == "" {
			e = &wire.APIError{Code: wire.CodeInternal, Message: "malformed error frame: " + record.Clip(string(f.Raw), 80)}
		}
		r.stopped = e
		return e
	}
	return nil
}

// scanSSELines splits at CRLF, LF or a lone CR, the three line ends of the
// SSE format.
func scanSSELines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		if data[i] == '\n' {
			return i + 1, data[:i], nil
		}
		if i+1 < len(data) {
			if data[i+1] == '\n' {
				return i + 2, data[:i], nil
			}
			return i + 1, data[:i], nil
		}
		if atEOF {
			return i + 1, data[:i], nil
		}
		return 0, nil, nil // a CR at the end: is an LF next?
	}
	if atEOF {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// IsCode reports whether err is an *wire.APIError with that code.
func IsCode(err error, code string) bool {
	var e *wire.APIError
	return errors.As(err, &e) && e.Code == code
}
