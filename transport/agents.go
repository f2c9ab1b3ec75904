package transport

import (
	"context"
	"hash/maphash"
	"net/http"
	"sync"
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

// turnLimits serialise the count-then-admit of deliveries to agents with
// a maxTurns, per session stripe, so that two racing deliveries cannot
// both take the last turn. (Within one process: nodes sharing a log each
// hold their own stripes.)
type turnLimits struct {
	once    sync.Once
	seed    maphash.Seed
	stripes [64]sync.Mutex
}

func (l *turnLimits) lock(key log.Key) func() {
	l.once.Do(func() { l.seed = maphash.MakeSeed() })
	m := &l.stripes[maphash.String(l.seed, key.String())%uint64(len(l.stripes))]
	m.Lock()
	return m.Unlock
}

// checkTurnLimit refuses a delivery to a session that has had max
// deliveries already (0 is no limit). The caller holds the session's
// stripe until its admission is done.
func (s *Server) checkTurnLimit(ctx context.Context, key log.Key, max int) error {
	if max <= 0 {
		return nil
	}
	n := 0
	off := log.Start
	for {
		res, err := s.db.Read(ctx, key, off, 1000)
		if err != nil {
			return err
		}
		for _, b := range res.Batches {
			recs, err := b.Records.Decode()
			if err != nil {
				return err
			}
			for _, r := range recs {
				if r.Kind == log.KindEntry && r.Entry != nil && r.Entry.Type == log.EntryUserMessage && r.Entry.SubmissionID != "" {
					n++
				}
			}
		}
		if n >= max {
			return apiErr(http.StatusConflict, CodeTurnLimitReached, "the session has had its %d turns (the agent's maxTurns)", max)
		}
		if res.UpToDate || res.NextOffset == off {
			return nil
		}
		off = res.NextOffset
	}
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
