package transport

import (
	"context"
	"net/http"
	"time"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/log"
	"github.com/convlog/convlog/worker"
	"github.com/labstack/echo/v4"
)

// AgentsList is the body of GET /agents.
type AgentsList struct {
	Agents []worker.AgentInfo `json:"agents"`
}

// agents is GET /agents: the agents served, their kind and busy policy;
// never their settings (URLs, keys, commands). With access control on, only
// those the caller's scopes may read.
func (s *Server) agents(c echo.Context) error {
	list := AgentsList{Agents: []worker.AgentInfo{}}
	if s.opts.ListAgents == nil {
		return writeJSON(c, http.StatusOK, list)
	}
	p, authed := PrincipalOf(c)
	for _, a := range s.opts.ListAgents() {
		// With access control on, a caller sees the agents it may read.
		if !authed || p.AllowsAgent(auth.VerbRead, a.Name) {
			list.Agents = append(list.Agents, a)
		}
	}
	return writeJSON(c, http.StatusOK, list)
}

// interruptTimeout bounds how long a delivery waits for the turns it
// interrupts to stop.
const interruptTimeout = 30 * time.Second

// interruptOthers aborts every unsettled submission of key but keep: the
// interrupt policy. Each running turn is cancelled and settled aborted
// before it returns.
func (s *Server) interruptOthers(ctx context.Context, key log.Key, keep string) {
	if s.opts.Abort == nil {
		return
	}
	// Not the request's context alone: a client that hangs up must not
	// leave an older submission unaborted, to run before its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interruptTimeout)
	defer cancel()
	pending, err := s.db.Pending(ctx, key)
	if err != nil {
		s.log.WarnContext(ctx, "interrupt: read pending", "session", key.String(), "err", err)
		return
	}
	for _, p := range pending {
		if p.ID == keep || p.Status.Terminal() {
			continue
		}
		if _, err := s.opts.Abort(ctx, p.ID); err != nil && ctx.Err() == nil {
			s.log.DebugContext(ctx, "interrupt: abort", "submission", p.ID, "err", err)
		}
	}
}
