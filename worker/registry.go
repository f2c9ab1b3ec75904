package worker

import (
	"fmt"
	"sync"

	clog "github.com/convlog/convlog/log"
)

// BusyPolicy says what admission does with a delivery to a session that has
// a turn running or queued.
type BusyPolicy string

// Busy policies.
const (
	// BusyEnqueue admits it; the next turn answers it (the default).
	BusyEnqueue BusyPolicy = "enqueue"
	// BusyReject refuses it: 409 session_busy.
	BusyReject BusyPolicy = "reject"
)

// Registry names the agents a process serves.
type Registry struct {
	mu     sync.RWMutex
	agents map[string]registered
}

type registered struct {
	agent Agent
	busy  BusyPolicy
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{agents: map[string]registered{}} }

// Register serves agent under name.
func (r *Registry) Register(name string, agent Agent, busy BusyPolicy) error {
	if err := clog.ValidateName(name); err != nil {
		return fmt.Errorf("register agent: %w", err)
	}
	switch busy {
	case "":
		busy = BusyEnqueue
	case BusyEnqueue, BusyReject:
	default:
		return fmt.Errorf("register agent %s: unknown busy policy %q", name, busy)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.agents[name] = registered{agent, busy}
	return nil
}

// Agent reports whether name is served and its busy policy.
func (r *Registry) Agent(name string) (policy string, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	a, ok := r.agents[name]
	return string(a.busy), ok
}

func (r *Registry) lookup(name string) (Agent, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	a, ok := r.agents[name]
	return a.agent, ok
}
