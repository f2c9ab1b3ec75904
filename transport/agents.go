package transport

import (
	"net/http"

	"github.com/convlog/convlog/internal/auth"
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
	p, authed := PrincipalOf(c)
	for _, a := range s.opts.Conversations.Agents() {
		// With access control on, a caller sees the agents it may read.
		if !authed || p.AllowsAgent(auth.VerbRead, a.Name) {
			list.Agents = append(list.Agents, a)
		}
	}
	return writeJSON(c, http.StatusOK, list)
}
