package pool

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
)

// Registry names the agents a process serves.
type Registry struct {
	mu     sync.RWMutex
	agents map[string]registered
}

type registered struct {
	agent worker.Agent
	opts  worker.AgentOptions
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{agents: map[string]registered{}} }

// Register serves agent under name with busy policy busy.
func (r *Registry) Register(name string, agent worker.Agent, busy worker.BusyPolicy) error {
	return r.RegisterWith(name, agent, worker.AgentOptions{Busy: busy})
}

// RegisterWith serves agent under name with opts.
func (r *Registry) RegisterWith(name string, agent worker.Agent, opts worker.AgentOptions) error {
	if err := record.ValidateName(name); err != nil {
		return fmt.Errorf("register agent: %w", err)
	}
	busy, err := worker.ParseBusyPolicy(string(opts.Busy))
	if err != nil {
		return fmt.Errorf("register agent %s: %w", name, err)
	}
	opts.Busy = busy
	if opts.Timeout < 0 || opts.MaxTurns < 0 {
		return fmt.Errorf("register agent %s: negative timeout or maxTurns", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.agents[name] = registered{agent, opts}
	return nil
}

// Options returns the options name is served with.
func (r *Registry) Options(name string) (worker.AgentOptions, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	a, ok := r.agents[name]
	return a.opts, ok
}

// List describes the agents served, sorted by name.
func (r *Registry) List() []worker.AgentInfo {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]worker.AgentInfo, 0, len(r.agents))
	for name, a := range r.agents {
		out = append(out, worker.AgentInfo{Name: name, Kind: a.opts.Kind, Busy: a.opts.Busy})
	}
	slices.SortFunc(out, func(a, b worker.AgentInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (r *Registry) lookup(name string) (worker.Agent, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	a, ok := r.agents[name]
	return a.agent, ok
}
