package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/internal/conversation"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// Log is what the server reads of the storage engine; *log.DB satisfies
// it. It is an interface so that the consumer states its needs, not so that
// it can be faked: the tests use a real *log.DB. Nothing here writes: every
// change of a conversation goes through Conversations.
type Log interface {
	Read(ctx context.Context, key record.Key, offset record.Offset, limit int) (record.ReadResult, error)
	// ReadBytes is Read with a smaller bound on the bytes of the page.
	ReadBytes(ctx context.Context, key record.Key, offset record.Offset, limit, maxBytes int) (record.ReadResult, error)
	Pending(ctx context.Context, key record.Key) ([]record.Submission, error)
	Submission(ctx context.Context, id string) (record.Submission, error)
	// Changed is closed by the next commit that appends to or resets key.
	Changed(key record.Key) (ch <-chan struct{}, release func())
	// Watch follows key for a reader that waits again and again.
	Watch(key record.Key) *log.Watch
	// Done is closed when the log closes.
	Done() <-chan struct{}
}

var _ Log = (*log.DB)(nil)

// Conversations is the conversation core (*conversation.Core): the rules
// of every change of a session live there, and the server calls one of
// these per request.
type Conversations interface {
	// Agent is the agent's settings, or conversation.ErrUnknownAgent.
	Agent(name string) (worker.AgentOptions, error)
	// Agents describes the agents served, for GET /agents.
	Agents() []worker.AgentInfo
	Admit(ctx context.Context, a log.Admission) (sub record.Submission, replayed bool, err error)
	Abort(ctx context.Context, submissionID string) (record.Submission, error)
	AbortSession(ctx context.Context, key record.Key) error
	Change(ctx context.Context, c log.Change) (log.ChangeResult, bool, error)
	Decide(ctx context.Context, d log.Decide) (log.Decided, bool, error)
}

var _ Conversations = (*conversation.Core)(nil)

// Readiness is a condition of /readyz besides the log being open.
type Readiness interface {
	// Ready is nil when ready, else why not.
	Ready() error
}

// Backuper writes a consistent copy of the log: begin gets its size and
// returns where to write it (*log.DB satisfies it).
type Backuper interface {
	Backup(ctx context.Context, begin func(size int64) (io.Writer, error)) (int64, error)
}

// DeltaSource supplies the presentation frames of running turns: token
// deltas and the like, which are not durable and not resumable. Readers
// pull them through a cursor, so that one frame costs the source O(1)
// however many readers follow the conversation, and a busy reader takes
// all that accumulated in one write.
type DeltaSource interface {
	// FollowDeltas follows key's frames from now on.
	FollowDeltas(key record.Key) (DeltaCursor, error)
}

// DeltaCursor is one reader's position in a conversation's frames.
type DeltaCursor interface {
	// Ready is closed when frames past the cursor exist.
	Ready() <-chan struct{}
	// Next appends the frames past the cursor to dst, moves the cursor
	// past them and returns dst. Frames the source no longer holds (the
	// reader fell too far behind) are skipped: they are presentation-only.
	// The frames must not be modified.
	Next(dst [][]byte) [][]byte
	// Close releases the cursor.
	Close()
}

// Options configures the HTTP server.
type Options struct {
	// Log is the storage engine, read. Required.
	Log Log
	// Conversations is the conversation core, which makes every change.
	// Required.
	Conversations Conversations
	// Auth turns on access control: every route but the health checks
	// needs a bearer token whose scopes allow it (internal/auth). Nil
	// serves everyone, which the binary allows only on loopback.
	Auth Authenticator
	// Limits bound each principal's deliveries and streams (with Auth).
	// Streams 0 is DefaultPrincipalStreams, not "no cap": one principal
	// must not be able to take every stream slot of the server.
	Limits auth.Limits
	// StreamTokenKey signs stream tokens (at least 32 bytes); nil draws a
	// random key, so a token opens streams on this process only.
	StreamTokenKey []byte
	// Deltas feeds live presentation frames to SSE readers; nil means none.
	Deltas DeltaSource
	// Ready adds a readiness condition to /readyz besides the log being
	// open. May be nil.
	Ready Readiness
	// MaxBody bounds a delivery's body. Default 8 MiB.
	MaxBody int64
	// BodyBudget bounds the bytes of request bodies held at once, from
	// their first byte to their admission; over it a delivery gets 503
	// overloaded with Retry-After. Default 16 × MaxBody; at least MaxBody.
	BodyBudget int64
	// BodyReadTimeout bounds the arrival of a request body, from when the
	// handler starts reading it: slower is 408 request_timeout. Default 60s.
	BodyReadTimeout time.Duration
	// PageBudget bounds the bytes of JSON pages (GET .../conversation)
	// being written at once; over it a read gets 503 overloaded with
	// Retry-After. A page alone always passes. Default 256 MiB.
	PageBudget int64
	// MaxViewBytes bounds the encoded messages view (GET …/messages, as
	// JSON or as an SSE frame): a larger one is 422 view_too_large (an
	// error frame on SSE). Default 16 MiB.
	MaxViewBytes int
	// StreamPageBytes bounds the records an SSE stream reads (and holds
	// while a slow reader takes them) at a time; a single batch larger
	// than it is still read whole. Default 256 KiB.
	StreamPageBytes int
	// Heartbeat is the period of SSE keepalive comments. Default 15s.
	Heartbeat time.Duration
	// WriteTimeout bounds the writing of every response, from when its
	// header is written, and each write of a stream: a peer that takes no
	// bytes for that long is dead or stalled; its connection is dropped
	// (a stream's reader resumes from its last event id). Default 30s.
	WriteTimeout time.Duration
	// MaxLag is how many records a live SSE reader may fall behind the
	// tail before it gets a final reader_too_slow frame and is
	// disconnected, to resume from its last offset. A reader catching up
	// from an old offset is not live until it first reaches the tail.
	// Default 100,000.
	MaxLag int
	// MaxStreams caps the open SSE streams; one more is refused 503
	// too_many_streams with Retry-After (and its connection closed).
	// Set it below the descriptor limit, leaving a reserve for deliveries,
	// health checks and the engine's own files. Default 10,000.
	MaxStreams int
	// CORSOrigins are the browser origins allowed to call the API from
	// another origin ("*" for any). None by default.
	CORSOrigins []string
	// A2ADefaultAgent is the agent whose A2A card is also served at
	// /.well-known/agent-card.json. None by default.
	A2ADefaultAgent string
	// Logger gets internal errors. Default slog.Default().
	Logger *slog.Logger
	// Observer is told about admissions, for metrics. May be nil.
	Observer Observer
	// Metrics serves GET /metrics (the Prometheus exposition); nil
	// disables the route (404).
	Metrics http.Handler
	// Backup serves POST /admin/backup, a consistent copy of the log
	// taken while the service runs; nil disables the route (404).
	Backup Backuper
}

// Defaults of Options.
const (
	DefaultMaxBody         = 8 << 20
	DefaultBodyReadTimeout = 60 * time.Second
	DefaultPageBudget      = 256 << 20
	DefaultMaxStreams      = 10_000
	// DefaultPrincipalStreams is a principal's cap of long-lived
	// responses when access control is on and Limits.Streams is 0.
	DefaultPrincipalStreams = 100
	DefaultStreamPageBytes  = 256 << 10
	DefaultMaxViewBytes     = 16 << 20
	DefaultHeartbeat        = 15 * time.Second
	DefaultWriteTimeout     = 30 * time.Second
	DefaultMaxLag           = 100_000
	// DefaultCoalesceFrom is how many readers of one conversation make
	// WakeDelay gather its wake-ups.
	DefaultCoalesceFrom = 500
)

// Server is the HTTP API. Create it with New.
type Server struct {
	opts   Options
	db     Log
	log    *slog.Logger
	echo   *echo.Echo
	stopAd atomic.Bool // StopAdmitting was called
	// streams counts open SSE streams: with many, each batches its
	// writes (coalesce).
	streams atomic.Int64
	// frames shares the live conversation frames among the streams.
	frames frameCache
	// written counts the streams' socket writes and their bytes.
	written streamCounters

	// closing is closed by Shutdown: streams and long polls end at once so
	// that a graceful stop does not wait for clients that never leave.
	closing chan struct{}
	// closingCtx is canceled with closing, for waits that end with a
	// context.
	closingCtx    context.Context
	cancelClosing context.CancelFunc
	closeOnce     sync.Once
	inflight      inflight

	limits       *auth.Limiter      // per principal, with Options.Auth
	streamTokens *auth.StreamTokens // for EventSource, with Options.Auth
	bodies       budget             // request body bytes in flight
	pages        budget             // JSON page bytes being written

	mu      sync.Mutex
	httpSrv *http.Server // set by Serve

	cursors *cursorSeal // the instances listing's
}

// New builds the server and its routes.
func New(opts Options) (*Server, error) {
	if opts.Log == nil {
		return nil, errors.New("transport: Options.Log is required")
	}
	if opts.Conversations == nil {
		return nil, errors.New("transport: Options.Conversations is required")
	}
	if opts.MaxBody <= 0 {
		opts.MaxBody = DefaultMaxBody
	}
	if opts.BodyBudget <= 0 {
		opts.BodyBudget = 16 * opts.MaxBody
	}
	opts.BodyBudget = max(opts.BodyBudget, opts.MaxBody)
	if opts.BodyReadTimeout <= 0 {
		opts.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if opts.PageBudget <= 0 {
		opts.PageBudget = DefaultPageBudget
	}
	if opts.MaxViewBytes <= 0 {
		opts.MaxViewBytes = DefaultMaxViewBytes
	}
	if opts.StreamPageBytes <= 0 {
		opts.StreamPageBytes = DefaultStreamPageBytes
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.MaxLag <= 0 {
		opts.MaxLag = DefaultMaxLag
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{opts: opts, db: opts.Log, log: opts.Logger, closing: make(chan struct{})}
	s.closingCtx, s.cancelClosing = context.WithCancel(context.Background())
	var err error
	if opts.Auth != nil {
		if opts.Limits.Streams <= 0 {
			opts.Limits.Streams = DefaultPrincipalStreams
			s.opts.Limits.Streams = DefaultPrincipalStreams
		}
		s.limits = auth.NewLimiter(opts.Limits)
		if s.streamTokens, err = auth.NewStreamTokens(opts.StreamTokenKey); err != nil {
			return nil, fmt.Errorf("transport: %w", err)
		}
	}
	s.bodies.limit, s.pages.limit = opts.BodyBudget, opts.PageBudget
	if s.cursors, err = newCursorSeal(opts.StreamTokenKey); err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.track)
	e.Use(s.writeDeadline)
	e.Use(checkQuery)
	if len(opts.CORSOrigins) > 0 {
		e.Use(middleware.CORSWithConfig(middleware.CORSConfig{
			AllowOrigins:  opts.CORSOrigins,
			AllowMethods:  []string{http.MethodGet, http.MethodPost, http.MethodDelete},
			AllowHeaders:  []string{echo.HeaderContentType, echo.HeaderAuthorization, "Idempotency-Key", "Last-Event-ID", echo.HeaderAccept, a2aVersionHeader, "A2A-Extensions"},
			ExposeHeaders: []string{echo.HeaderLocation, "Idempotent-Replayed", aiSDKStreamHeader, a2aVersionHeader},
			MaxAge:        600,
		}))
	}
	e.Use(s.authorize)
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{
		LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
			s.log.ErrorContext(c.Request().Context(), "panic in handler", "path", c.Request().URL.Path, "err", err, "stack", string(stack))
			return fmt.Errorf("panic: %w", err) // not an *APIError: becomes 500 internal
		},
	}))
	// No Timeout middleware anywhere: streams and long polls are meant to
	// last, and a timeout would write over a committed response.
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/openapi.json", s.openapi)
	e.GET("/agents", s.agents)
	const base = "/agents/:name/:instanceId"
	e.POST(base, s.deliver)
	e.GET(base+"/conversation", s.conversation)
	e.GET(base+"/stream", s.stream)
	e.GET(base+"/messages", s.messages)
	e.GET(base+"/submissions/:submissionId", s.submission)
	e.POST(base+"/stream-token", s.streamToken)
	e.POST(base+"/submissions/:submissionId/abort", s.abort)
	e.POST(base+"/submissions/:submissionId/approvals", s.approvals)
	// Listing, rewind, regenerate, fork, reset, delete: lifecycle.go.
	if ll, ok := opts.Log.(LifecycleLog); ok {
		s.lifecycleRoutes(e, base, ll)
	}
	// The client adapters (aisdk.go, agui.go, a2a.go): views of the same
	// log and deltas in the formats of the AI SDK, AG-UI and A2A.
	e.POST("/ai-sdk/:agent", s.aiSDKChat)
	e.GET("/ai-sdk/:agent/:chatId/stream", s.aiSDKResume)
	e.POST("/ag-ui/:agent", s.agUIRun)
	e.POST("/a2a/:agent", s.a2aRPC)
	e.GET("/a2a/:agent/.well-known/agent-card.json", s.a2aCard)
	e.GET("/.well-known/agent-card.json", s.a2aDefaultCard)
	// The web console and the JS client: static files embedded in the
	// binary (static.go).
	s.registerStatic(e)
	if opts.Metrics != nil {
		e.GET("/metrics", s.metrics)
	}
	if opts.Backup != nil {
		e.POST("/admin/backup", s.backup)
	}
	s.echo = e
	return s, nil
}

// Handler is the server's http.Handler, for a caller that runs its own
// http.Server (clear no deadline there that streams need: they clear their
// own write deadline).
func (s *Server) Handler() http.Handler { return s.echo }

// Serve serves on l until Shutdown, with header read timeouts and a write
// timeout of Options.WriteTimeout from when each response starts (streams
// and long polls manage their own). It returns http.ErrServerClosed after
// Shutdown.
func (s *Server) Serve(l net.Listener) error {
	srv := &http.Server{
		Handler:           s.echo,
		ReadHeaderTimeout: 10 * time.Second,
		// Also bounds net/http's own answers (a malformed request's 400)
		// on a connection whose previous deadline has passed; handlers
		// re-arm it when they answer (writeDeadline) and streams per write.
		WriteTimeout:   s.opts.WriteTimeout,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.mu.Lock()
	if s.closed() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.httpSrv = srv
	s.mu.Unlock()
	// net/http refuses unparsable requests itself, in plain text, before
	// any handler runs; the wrapper rewrites those answers as JSON.
	return srv.Serve(jsonErrorListener{Listener: l, maxHeaderBytes: srv.MaxHeaderBytes})
}

// StopAdmitting makes deliveries fail with 503 shutting_down and /readyz
// report not ready, while reads and streams go on. It is the first step of a
// graceful stop, before the log closes.
func (s *Server) StopAdmitting() { s.stopAd.Store(true) }

// Shutdown stops admitting, ends every stream and long poll (readers
// reconnect elsewhere with their last offset), stops the http.Server of
// Serve if any, and waits for in-flight requests until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.StopAdmitting()
	s.closeOnce.Do(func() {
		close(s.closing)
		s.cancelClosing()
	})
	s.mu.Lock()
	srv := s.httpSrv
	s.mu.Unlock()
	var err error
	if srv != nil {
		// Idle connections close at once; connections that never sent a
		// request count as busy for five seconds in net/http. Streams and
		// long polls already ended, so give the rest a second, then close.
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		err = srv.Shutdown(sctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			err = srv.Close()
		}
	}
	if werr := s.inflight.wait(ctx); err == nil {
		err = werr
	}
	return err
}

func (s *Server) closed() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// writeDeadline gives every response a write deadline, armed when its
// header is written (so a handler that waits, an abort or a long poll, does
// not spend it): a client that never reads its response, a 4 MiB page say,
// holds it for WriteTimeout, not forever. Streams re-arm it per write.
func (s *Server) writeDeadline(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		res := c.Response()
		res.Before(func() {
			_ = http.NewResponseController(res.Writer).SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout))
		})
		return next(c)
	}
}

// track counts requests in flight for Shutdown.
func (s *Server) track(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		s.inflight.add(1)
		defer s.inflight.add(-1)
		return next(c)
	}
}

// inflight counts requests; wait returns when the count is zero. A
// WaitGroup would forbid Add while Wait runs, which requests do.
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to zero; replaced when it rises
}

func (f *inflight) add(d int) {
	f.mu.Lock()
	if f.n == 0 && d > 0 {
		f.idle = make(chan struct{})
	}
	f.n += d
	if f.n == 0 {
		close(f.idle)
	}
	f.mu.Unlock()
}

func (f *inflight) wait(ctx context.Context) error {
	for {
		f.mu.Lock()
		n, idle := f.n, f.idle
		f.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return fmt.Errorf("transport: %d requests still in flight: %w", n, ctx.Err())
		}
	}
}

// instance validates the route's agent and instance and checks the agent
// exists.
func (s *Server) instance(c echo.Context) (agent, instance string, err error) {
	agent, instance = pathParam(c, "name"), pathParam(c, "instanceId")
	if err := record.ValidateName(agent); err != nil {
		return "", "", &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "agent: " + err.Error(), Cause: err}
	}
	if err := record.ValidateName(instance); err != nil {
		return "", "", &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "instance: " + err.Error(), Cause: err}
	}
	if _, err := s.opts.Conversations.Agent(agent); err != nil {
		return "", "", err
	}
	return agent, instance, nil
}

// pathParam is a path parameter, percent-decoded: echo matches on the raw
// path when the client escaped a character that needed none (%40 for @).
func pathParam(c echo.Context, name string) string {
	v := c.Param(name)
	if u, err := url.PathUnescape(v); err == nil {
		return u
	}
	return v
}

// sessionKey adds the session of the query (default "default") to the route.
func sessionKey(c echo.Context, agent, instance string) (record.Key, error) {
	session := record.DefaultSession
	if vs, ok := c.QueryParams()["session"]; ok {
		session = vs[0]
	}
	if err := record.ValidateName(session); err != nil {
		return record.Key{}, &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidName, Message: "session: " + err.Error(), Cause: err}
	}
	return record.Key{Agent: agent, Instance: instance, Session: session}, nil
}

// queryOffset is the offset query parameter, "0" when absent.
func queryOffset(c echo.Context) (record.Offset, error) {
	vs, ok := c.QueryParams()["offset"]
	if !ok {
		return record.Start, nil
	}
	return parseOffset(vs[0])
}

func parseOffset(s string) (record.Offset, error) {
	o, err := record.ParseOffset(s)
	if err != nil {
		return "", &wire.APIError{Status: http.StatusBadRequest, Code: wire.CodeInvalidOffset, Message: err.Error(), Cause: err}
	}
	return o, nil
}

// instancePath is the path of an agent instance, for the URLs we hand out.
func instancePath(agent, instance string) string { return wire.InstancePath(agent, instance) }

// writeJSON writes v as the response body. Unlike echo's c.JSON it leaves
// '&', '<' and '>' alone: the URLs of the 202 body read as the reference
// shows them, and nothing here is meant for an HTML page.
func writeJSON(c echo.Context, status int, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	return c.Blob(status, echo.MIMEApplicationJSON, buf.Bytes())
}
