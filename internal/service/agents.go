package service

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/convlog/convlog/internal/config"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/projection"
	"github.com/convlog/convlog/worker"
	"github.com/convlog/convlog/worker/execagent"
	"github.com/convlog/convlog/worker/httpagent"
	"github.com/convlog/convlog/worker/openaiagent"
	"github.com/convlog/convlog/worker/pool"
)

// LogReader is what the agents that rebuild their context each turn read
// their conversation's history from: the *log.DB, or a remote worker's
// log client (worker/remote).
type LogReader interface {
	Read(ctx context.Context, key record.Key, offset record.Offset, limit int) (record.ReadResult, error)
}

// RegisterAgents registers in agents the agents of the config file f (nil
// or listing none: the built-in echo, with echoDelay) with the busy
// policies of the --busy-policy flags, as `serve` does. `convlog worker`
// serves the same file with it, reading history through its log client.
func RegisterAgents(f *config.File, busy map[string]string, echoDelay time.Duration, agents *pool.Registry, log LogReader, logger *slog.Logger) error {
	return registerAgents(Config{Agents: f, BusyPolicies: busy, EchoDelay: echoDelay}, agents, log, logger)
}

// registerAgents serves the agents of the config file, or the built-in
// echo when it lists none.
func registerAgents(cfg Config, agents *pool.Registry, db LogReader, logger *slog.Logger) error {
	if cfg.Agents == nil || len(cfg.Agents.Agents) == 0 {
		builtin := map[string]worker.Agent{"echo": worker.Echo{Delay: cfg.EchoDelay}}
		for name := range cfg.BusyPolicies {
			if builtin[name] == nil {
				return fmt.Errorf("busy policy for %q: no such agent", name)
			}
		}
		for name, agent := range builtin {
			if err := agents.RegisterWith(name, agent, worker.AgentOptions{Kind: config.KindEcho, Busy: worker.BusyPolicy(cfg.BusyPolicies[name])}); err != nil {
				return err
			}
		}
		return nil
	}
	history := logHistory{db}
	for _, a := range cfg.Agents.Agents {
		agent, err := buildAgent(a, history, logger)
		if err != nil {
			return err
		}
		opts := a.Options()
		if p, ok := cfg.BusyPolicies[a.Name]; ok {
			opts.Busy = worker.BusyPolicy(p) // the flag wins over the file
		}
		if err := agents.RegisterWith(a.Name, agent, opts); err != nil {
			return err
		}
	}
	for name := range cfg.BusyPolicies {
		if _, ok := agents.Options(name); !ok {
			return fmt.Errorf("busy policy for %q: no such agent", name)
		}
	}
	return nil
}

func buildAgent(a config.Agent, history openaiagent.History, logger *slog.Logger) (worker.Agent, error) {
	switch a.Kind {
	case config.KindEcho:
		return worker.Echo{Delay: a.Delay.Duration}, nil
	case config.KindHTTP:
		return &httpagent.Agent{URL: a.URL, Headers: a.Headers}, nil
	case config.KindExec:
		return &execagent.Agent{Command: a.Command, Dir: a.Dir, Env: a.Env, Grace: a.Grace.Duration, Logger: logger}, nil
	case config.KindOpenAI:
		key := ""
		if a.APIKeyEnv != "" {
			key = os.Getenv(a.APIKeyEnv)
			if key == "" {
				logger.Warn("agent's API key variable is empty", "agent", a.Name, "apiKeyEnv", a.APIKeyEnv)
			}
		}
		var tools []openaiagent.Tool
		for _, t := range a.Tools {
			tools = append(tools, openaiagent.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters, URL: t.URL, AllowPrivate: t.AllowPrivate, Approval: t.Approval})
		}
		return &openaiagent.Agent{
			BaseURL: a.BaseURL, APIKey: key, Model: a.Model, System: a.System, Tools: tools, History: history,
			MaxSteps: a.MaxSteps, MaxAttempts: a.MaxAttempts, Temperature: a.Temperature, MaxTokens: a.MaxTokens,
			ToolTimeout: a.ToolTimeout.Duration,
		}, nil
	}
	return nil, fmt.Errorf("agent %s: unknown kind %q", a.Name, a.Kind)
}

// logHistory reads a conversation's active path from the log, for the
// agents that rebuild their context each turn.
type logHistory struct{ db LogReader }

// maxHistoryRecords bounds what one turn reads of its conversation.
const maxHistoryRecords = 1 << 20

func (h logHistory) Messages(ctx context.Context, scope worker.Scope) ([]projection.Message, error) {
	session, ok := strings.CutPrefix(scope.Session, scope.Agent+"/"+scope.Instance+"/")
	if !ok {
		return nil, fmt.Errorf("scope %q: not a session of %s/%s", scope.Session, scope.Agent, scope.Instance)
	}
	key := record.Key{Agent: scope.Agent, Instance: scope.Instance, Session: session}
	p := projection.NewProjector()
	off, n := record.Start, 0
	for {
		res, err := h.db.Read(ctx, key, off, 1000)
		if err != nil {
			return nil, err
		}
		for _, b := range res.Batches {
			recs, err := b.Records.Decode()
			if err != nil {
				return nil, err
			}
			p.Apply(recs...)
			n += len(recs)
		}
		if res.UpToDate || res.NextOffset == off || n > maxHistoryRecords {
			return p.View().Messages, nil
		}
		off = res.NextOffset
	}
}
