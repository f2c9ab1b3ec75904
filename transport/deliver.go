package transport

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport/wire"
	"github.com/labstack/echo/v4"

	"github.com/convlog/convlog/log/record"
)

// Delivery is a decoded and validated delivery: the session it goes to and
// the payload of the user_message entry that will carry it.
type Delivery struct {
	Session string
	Payload record.MessagePayload
	// UID is the generation the delivery names, "" for the current one.
	UID string
}

// Record is the user_message entry record that admits the delivery.
func (d Delivery) Record() (record.Record, error) {
	// Without HTML escaping: '<' stays one byte, so what is stored is the
	// size that was sent and the body limit means what it says.
	p, err := marshalNoHTML(d.Payload)
	if err != nil {
		return record.Record{}, err
	}
	return record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: p}), nil
}

// Limits of a delivery's fields beyond the body size.
const (
	maxUIDLength      = 128
	maxParts          = 1024
	maxPartNameLength = 256
)

// MetadataPrincipal is the user entry's metadata key under which the server
// records who delivered it ({"issuer","subject"}), with access control on.
// A client may not set it.
const MetadataPrincipal = "principal"

// recordPrincipal writes the caller into the message's metadata.
func recordPrincipal(d *Delivery, p auth.Principal, authed bool) error {
	if len(d.Payload.Metadata) > 0 {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(d.Payload.Metadata, &m); err == nil {
			if _, ok := m[MetadataPrincipal]; ok {
				return badRequest(`"message.metadata.principal" is reserved: the server records the caller there`)
			}
		}
	}
	if !authed {
		return nil
	}
	who, err := json.Marshal(p)
	if err != nil {
		return err
	}
	meta, err := mergeMetadata(d.Payload.Metadata, map[string]json.RawMessage{MetadataPrincipal: who})
	if err != nil {
		return err
	}
	d.Payload.Metadata = meta
	return nil
}

// Metadata keys under which the top-level initialData and uid are stored.
const (
	MetadataInitialData = "initialData"
	MetadataUID         = "uid"
)

// deliveryWire and messageWire are the strict decoding forms: pointers and
// raw values tell absent, null and empty apart, which the error messages
// need.
type deliveryWire struct {
	Message     json.RawMessage `json:"message"`
	Session     *string         `json:"session"`
	InitialData json.RawMessage `json:"initialData"`
	UID         *string         `json:"uid"`
}

type messageWire struct {
	Kind     *string         `json:"kind"`
	Body     *string         `json:"body"`
	Parts    []record.Part   `json:"parts"`
	Purpose  *string         `json:"purpose"`
	Display  *string         `json:"display"`
	Metadata json.RawMessage `json:"metadata"`
}

// DecodeDelivery decodes and validates a delivery body. Every failure is an
// *APIError with status 400 (bad_request, or invalid_name for the session)
// whose message names the offending field; it never panics.
func DecodeDelivery(body []byte) (Delivery, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return Delivery{}, badRequest("the request body is empty")
	}
	if err := checkStrictJSON(body); err != nil {
		return Delivery{}, err
	}
	var w deliveryWire
	if err := strictUnmarshal(body, &w); err != nil {
		return Delivery{}, badRequest("%s", describeJSONError(err, ""))
	}
	if isNull(w.Message) {
		return Delivery{}, badRequest(`"message" is required`)
	}
	d := Delivery{Session: record.DefaultSession}
	if w.Session != nil {
		if err := record.ValidateName(*w.Session); err != nil {
			return Delivery{}, &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "session: " + err.Error(), Cause: err}
		}
		d.Session = *w.Session
	}
	m, err := decodeMessage(w.Message)
	if err != nil {
		return Delivery{}, err
	}
	d.Payload = m
	extra := map[string]json.RawMessage{}
	if !isNull(w.InitialData) {
		extra[MetadataInitialData] = w.InitialData
	}
	if w.UID != nil {
		uid := *w.UID
		if uid == "" || len(uid) > maxUIDLength || !printableText(uid) {
			return Delivery{}, badRequest(`"uid" must be 1 to %d printable characters`, maxUIDLength)
		}
		extra[MetadataUID], _ = marshalNoHTML(uid)
		d.UID = uid
	}
	if len(extra) > 0 {
		if d.Payload.Metadata, err = mergeMetadata(d.Payload.Metadata, extra); err != nil {
			return Delivery{}, err
		}
	}
	return d, nil
}

// decodeMessage turns "message" (a string or a DeliveredMessage object)
// into the user entry's payload. body becomes the first text part.
func decodeMessage(raw json.RawMessage) (record.MessagePayload, error) {
	var p record.MessagePayload
	switch raw[0] {
	case '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return p, badRequest(`"message": %s`, describeJSONError(err, ""))
		}
		if strings.TrimSpace(text) == "" {
			return p, badRequest(`"message" is empty`)
		}
		p.Parts = []record.Part{{Type: record.PartText, Text: text}}
		return p, nil
	case '{':
	default:
		return p, badRequest(`"message" must be a string or an object`)
	}
	var m messageWire
	if err := strictUnmarshal(raw, &m); err != nil {
		return p, badRequest("%s", describeJSONError(err, "message."))
	}
	if m.Kind == nil {
		return p, badRequest(`"message.kind" is required and must be "user"`)
	}
	if *m.Kind != "user" {
		return p, badRequest(`"message.kind" must be "user", not %q`, record.Clip(*m.Kind, 40))
	}
	if m.Body != nil {
		if strings.TrimSpace(*m.Body) == "" {
			return p, badRequest(`"message.body" is empty`)
		}
		p.Parts = append(p.Parts, record.Part{Type: record.PartText, Text: *m.Body})
	}
	if len(m.Parts) > maxParts {
		return p, badRequest(`"message.parts" has %d parts (at most %d)`, len(m.Parts), maxParts)
	}
	for i, part := range m.Parts {
		if err := validatePart(part); err != nil {
			return p, badRequest(`"message.parts[%d]": %s`, i, err)
		}
		p.Parts = append(p.Parts, part)
	}
	if len(p.Parts) == 0 {
		return p, badRequest(`"message" needs a "body" or at least one part`)
	}
	if m.Purpose != nil {
		switch *m.Purpose {
		case record.PurposeUser, record.PurposeDispatch, record.PurposeAdvisory:
			p.Purpose = *m.Purpose
		default:
			return p, badRequest(`"message.purpose" must be "user", "dispatch" or "advisory", not %q`, record.Clip(*m.Purpose, 40))
		}
	}
	if m.Display != nil {
		switch *m.Display {
		case record.DisplayVisible, record.DisplayHidden, record.DisplayDiagnostic:
			p.Display = *m.Display
		default:
			return p, badRequest(`"message.display" must be "visible", "hidden" or "diagnostic", not %q`, record.Clip(*m.Display, 40))
		}
	}
	if !isNull(m.Metadata) {
		if m.Metadata[0] != '{' {
			return p, badRequest(`"message.metadata" must be an object`)
		}
		p.Metadata = m.Metadata
	}
	return p, nil
}

// validatePart accepts the part types a user may send: text, file, data,
// each with only its own fields.
func validatePart(p record.Part) error {
	var allowed []string
	switch p.Type {
	case record.PartText:
		if p.Text == "" {
			return errors.New(`a text part needs a non-empty "text"`)
		}
		allowed = []string{"text"}
	case record.PartFile:
		if p.MediaType == "" {
			return errors.New(`a file part needs "mediaType"`)
		}
		if _, _, err := mime.ParseMediaType(p.MediaType); err != nil {
			return fmt.Errorf(`"mediaType" %q is not a media type`, record.Clip(p.MediaType, 40))
		}
		if p.URL == "" {
			return errors.New(`a file part needs "url" (a data: URL for inline bytes)`)
		}
		u, err := url.Parse(p.URL)
		if err != nil || (u.Scheme != "data" && u.Scheme != "http" && u.Scheme != "https") {
			return errors.New(`"url" must be a data:, http: or https: URL`)
		}
		if len(p.Filename) > maxPartNameLength || !printableText(p.Filename) {
			return fmt.Errorf(`"filename" must be at most %d printable characters`, maxPartNameLength)
		}
		allowed = []string{"mediaType", "url", "filename"}
	case record.PartData:
		if isNull(p.Data) {
			return errors.New(`a data part needs "data"`)
		}
		if len(p.Name) > maxPartNameLength || !printableText(p.Name) {
			return fmt.Errorf(`"name" must be at most %d printable characters`, maxPartNameLength)
		}
		allowed = []string{"name", "data"}
	case "":
		return errors.New(`"type" is required (text, file or data)`)
	default:
		return fmt.Errorf(`type %q is not accepted in a user message (text, file or data)`, record.Clip(p.Type, 40))
	}
	set := map[string]bool{
		"text": p.Text != "", "toolCallId": p.ToolCallID != "", "toolName": p.ToolName != "",
		"input": len(p.Input) > 0, "mediaType": p.MediaType != "", "url": p.URL != "",
		"filename": p.Filename != "", "name": p.Name != "", "data": len(p.Data) > 0,
	}
	for _, f := range allowed {
		delete(set, f)
	}
	for _, f := range []string{"text", "toolCallId", "toolName", "input", "mediaType", "url", "filename", "name", "data"} {
		if set[f] {
			return fmt.Errorf(`field %q does not belong in a %s part`, f, p.Type)
		}
	}
	return nil
}

// mergeMetadata adds the top-level delivery fields to the message's
// metadata object. A key given both ways is refused rather than silently
// overwritten.
func mergeMetadata(meta json.RawMessage, extra map[string]json.RawMessage) (json.RawMessage, error) {
	m := map[string]json.RawMessage{}
	if len(meta) > 0 {
		if err := json.Unmarshal(meta, &m); err != nil {
			return nil, badRequest(`"message.metadata" must be an object`)
		}
	}
	for k, v := range extra {
		if _, dup := m[k]; dup {
			return nil, badRequest(`%q is given both at the top level and in "message.metadata"`, k)
		}
		m[k] = v
	}
	b, err := marshalNoHTML(m)
	if err != nil {
		return nil, badRequest(`"message.metadata": %v`, err)
	}
	return b, nil
}

// strictUnmarshal decodes one JSON value into v, refusing unknown fields
// and anything after the value.
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

// describeJSONError rewords decoding errors for a client: which field, what
// was wrong, without Go type names.
func describeJSONError(err error, prefix string) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("invalid JSON at byte %d: %s", se.Offset, se.Error())
	case errors.As(err, &te):
		if te.Field == "" {
			return fmt.Sprintf("the body must be a JSON object, not %s", te.Value)
		}
		return fmt.Sprintf("%q must not be %s", prefix+te.Field, te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "invalid JSON: unexpected end of input"
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		if name, err := strconv.Unquote(f); err == nil {
			f = strconv.Quote(name)
		}
		if prefix != "" {
			return fmt.Sprintf("unknown field %s in %q", f, strings.TrimSuffix(prefix, "."))
		}
		return "unknown field " + f
	}
	return "invalid JSON: " + strings.TrimPrefix(msg, "json: ")
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// printableText is valid UTF-8 without control characters.
func printableText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// deliver is POST /agents/:name/:instanceId.
func (s *Server) deliver(c echo.Context) (err error) {
	var replayed bool
	defer func() { s.observeAdmission(err, replayed) }()
	if s.stopAd.Load() {
		return apiErr(http.StatusServiceUnavailable, wire.CodeShuttingDown, "the server is shutting down and admits nothing")
	}
	agent, instance, err := s.instance(c)
	if err != nil {
		return err
	}
	req := c.Request()
	if _, ok := req.URL.Query()["session"]; ok {
		// A POST takes its session from the body only: two places for one
		// value would leave a message in a session its sender did not mean.
		return badRequest(`a delivery names its session in the body's "session" field, not in the query`)
	}
	idemKey, err := idempotencyKey(req.Header)
	if err != nil {
		return err
	}
	if err := checkJSONContentType(req.Header.Get(echo.HeaderContentType)); err != nil {
		return err
	}
	body, release, err := s.readBody(c)
	if err != nil {
		return err
	}
	// The body and what is decoded from it live until the admission.
	defer release()
	d, err := DecodeDelivery(body)
	if err != nil {
		return err
	}
	key := record.Key{Agent: agent, Instance: instance, Session: d.Session}
	ctx := req.Context()
	principal, authed := PrincipalOf(c)
	if err := recordPrincipal(&d, principal, authed); err != nil {
		return err
	}
	rec, err := d.Record()
	if err != nil {
		return badRequest("the message cannot be encoded for storage")
	}
	// The agent's rules (busy policy, maxTurns) are the core's to apply.
	a := log.Admission{Key: key, Records: []record.Record{rec}, UID: d.UID}
	if idemKey != "" {
		a.IdempotencyKey = idemKey
		// The principal is part of the request: another caller reusing
		// the key gets a 422, never the first caller's 202.
		a.RequestHash = requestHash(agent, instance, principal.Issuer+"\x00"+principal.Subject, body)
	}
	var sub record.Submission
	sub, replayed, err = s.opts.Conversations.Admit(ctx, a)
	if err != nil {
		return err
	}
	acc := accepted(agent, instance, d.Session, sub)
	acc.UID = sub.UID
	if replayed {
		// The body is the first response's, byte for byte; the header only
		// tells a curious client that nothing new was admitted.
		c.Response().Header().Set("Idempotent-Replayed", "true")
	}
	c.Response().Header().Set(echo.HeaderLocation, instancePath(agent, instance)+"/submissions/"+url.PathEscape(sub.ID))
	return writeJSON(c, http.StatusAccepted, acc)
}

func accepted(agent, instance, session string, sub record.Submission) wire.Accepted {
	q := "?session=" + url.QueryEscape(session) + "&offset=" + url.QueryEscape(string(sub.Offset))
	p := instancePath(agent, instance)
	return wire.Accepted{
		SubmissionID:    sub.ID,
		StreamURL:       p + "/conversation" + q,
		ConversationURL: p + "/conversation" + q,
		UpdatesURL:      p + "/stream" + q,
		Offset:          sub.Offset,
	}
}

// requestHash identifies a request for idempotency: the same key with
// another hash is a reuse, not a retry. The body is hashed as received, so
// a retry must resend the same bytes.
func requestHash(agent, instance, principal string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(agent + "/" + instance + "\n"))
	if principal != "\x00" {
		h.Write([]byte(principal + "\n"))
	}
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// idempotencyKey reads the Idempotency-Key header: at most 256 visible
// ASCII characters; absent or empty means none.
func idempotencyKey(h http.Header) (string, error) {
	vs := h.Values("Idempotency-Key")
	if len(vs) == 0 || (len(vs) == 1 && vs[0] == "") {
		return "", nil
	}
	if len(vs) > 1 {
		return "", badRequest("more than one Idempotency-Key header")
	}
	k := vs[0]
	if len(k) > log.MaxIdempotencyKeyLength {
		return "", badRequest("the Idempotency-Key is longer than %d characters", log.MaxIdempotencyKeyLength)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return "", badRequest("the Idempotency-Key must be printable ASCII")
		}
	}
	return k, nil
}

// checkJSONContentType accepts application/json with, at most, a UTF-8
// charset: JSON is UTF-8 (RFC 8259).
func checkJSONContentType(ct string) error {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != echo.MIMEApplicationJSON {
		return apiErr(http.StatusUnsupportedMediaType, wire.CodeUnsupportedMediaType, "the body must be application/json, not %q", record.Clip(ct, 40))
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return apiErr(http.StatusUnsupportedMediaType, wire.CodeUnsupportedMediaType, "application/json takes only charset=utf-8, not %s=%q", record.Clip(k, 40), record.Clip(v, 40))
		}
	}
	return nil
}

// readBody reads the body within MaxBody; over it is 413 payload_too_large.
// The body's bytes are reserved in the server's body budget until release
// is called (503 overloaded when it is spent), and the body must arrive
// within BodyReadTimeout (408 request_timeout): a client that dribbles
// bytes does not hold a buffer and a connection for ever.
func (s *Server) readBody(c echo.Context) (body []byte, release func(), err error) {
	req := c.Request()
	if req.ContentLength > s.opts.MaxBody {
		return nil, nil, apiErr(http.StatusRequestEntityTooLarge, wire.CodePayloadTooLarge, "the request body is larger than %d bytes", s.opts.MaxBody)
	}
	var held int64
	var src io.Reader = req.Body
	var br *budgetReader
	if req.ContentLength >= 0 {
		if !s.bodies.take(req.ContentLength) {
			s.discardBody(c)
			return nil, nil, s.overBodyBudget(c)
		}
		held = req.ContentLength
	} else { // chunked: reserve as it arrives
		br = &budgetReader{r: req.Body, b: &s.bodies, limit: s.opts.MaxBody + 1}
		src = br
	}
	release = func() { s.bodies.give(held) }
	rc := http.NewResponseController(c.Response().Writer)
	_ = rc.SetReadDeadline(time.Now().Add(s.opts.BodyReadTimeout))
	// The underlying writer, so that net/http closes the connection after
	// the reply rather than reading the rest of an oversized body.
	r := http.MaxBytesReader(c.Response().Writer, io.NopCloser(src), s.opts.MaxBody)
	var buf bytes.Buffer
	if req.ContentLength >= 0 {
		buf.Grow(int(req.ContentLength) + bytes.MinRead) // one allocation, not a doubling series
	}
	_, err = buf.ReadFrom(r)
	if br != nil {
		held = br.held
	}
	if err != nil {
		release()
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, nil, apiErr(http.StatusRequestEntityTooLarge, wire.CodePayloadTooLarge, "the request body is larger than %d bytes", s.opts.MaxBody)
		case errors.Is(err, errOverBudget):
			s.discardBody(c)
			return nil, nil, s.overBodyBudget(c)
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The read deadline stays passed: net/http must not wait for
			// the rest of this body either.
			c.Response().Header().Set(echo.HeaderConnection, "close")
			return nil, nil, apiErr(http.StatusRequestTimeout, wire.CodeRequestTimeout, "the request body did not arrive within %s", s.opts.BodyReadTimeout)
		}
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, nil, ctxErr
		}
		return nil, nil, badRequest("the request body could not be read (the connection failed or the chunked encoding is malformed)")
	}
	// No deadline while the handler works: an expired one would make
	// net/http's background read cancel the request's context.
	_ = rc.SetReadDeadline(time.Time{})
	return buf.Bytes(), release, nil
}

// discardBody reads a refused body to its end without keeping it, within
// the body deadline: closing a connection with unread bytes makes the
// kernel reset it, and the client would see a reset instead of the 503.
func (s *Server) discardBody(c echo.Context) {
	rc := http.NewResponseController(c.Response().Writer)
	_ = rc.SetReadDeadline(time.Now().Add(s.opts.BodyReadTimeout))
	_, err := io.Copy(io.Discard, http.MaxBytesReader(c.Response().Writer, c.Request().Body, s.opts.MaxBody))
	if err == nil {
		_ = rc.SetReadDeadline(time.Time{})
	}
}

func (s *Server) overBodyBudget(c echo.Context) *wire.APIError {
	return overloaded(c, wire.CodeOverloaded, "the server holds its limit of request bodies in flight (%d bytes); retry shortly", s.opts.BodyBudget)
}
