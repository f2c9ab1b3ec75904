// Package config loads convlog.yaml, the file `convlog serve --config`
// takes: the agents a process serves. Decoding is strict (an unknown key is
// an error, so a typo never silently falls back to a default) and every
// error names the file, the line and the field, so that a bad file stops
// the process before it listens with one message that says what to fix.
package config

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/worker"
)

// File is the whole file. Each top-level section is a field of its own,
// with its own validation; an unknown top-level key is refused.
type File struct {
	// Agents are the agents served; none listed serves the built-in echo,
	// as without a file.
	Agents []Agent `yaml:"agents"`
	// Auth is access control (docs/security.md); nil is none.
	Auth *auth.Config `yaml:"auth"`
}

// Kinds of agent.
const (
	KindEcho   = "echo"
	KindOpenAI = "openai"
	KindHTTP   = "http"
	KindExec   = "exec"
)

// Agent is one entry of agents:. The kind-specific fields of other kinds
// must be absent.
type Agent struct {
	Name     string   `yaml:"name"`
	Kind     string   `yaml:"kind"`
	Busy     string   `yaml:"busy"`
	Timeout  Duration `yaml:"timeout"`
	MaxTurns int      `yaml:"maxTurns"`
	// ApprovalTimeout bounds how long a submission waits for a person to
	// decide the tool calls its turn asked about: then what is undecided
	// is denied, reason "timeout". 0 (or absent) waits without limit.
	// Refused on kind echo, which never asks.
	ApprovalTimeout Duration `yaml:"approvalTimeout"`

	// echo
	Delay Duration `yaml:"delay"`

	// openai
	BaseURL     string   `yaml:"baseURL"`
	Model       string   `yaml:"model"`
	APIKeyEnv   string   `yaml:"apiKeyEnv"`
	System      string   `yaml:"system"`
	Tools       []Tool   `yaml:"tools"`
	MaxSteps    int      `yaml:"maxSteps"`
	MaxAttempts int      `yaml:"maxAttempts"`
	Temperature *float64 `yaml:"temperature"`
	MaxTokens   int      `yaml:"maxTokens"`
	ToolTimeout Duration `yaml:"toolTimeout"`

	// http (URL, Headers), exec (Command, Dir, Env, Grace)
	URL     string            `yaml:"url"`
	Headers map[string]string `yaml:"headers"`
	Command []string          `yaml:"command"`
	Dir     string            `yaml:"dir"`
	Env     map[string]string `yaml:"env"`
	Grace   Duration          `yaml:"grace"`
}

// Duration is a duration written as Go writes them: 30s, 10m, 1h30m.
type Duration struct {
	time.Duration
	raw string
}

// UnmarshalText keeps the text: it is parsed by validation, which knows
// the line to report.
func (d *Duration) UnmarshalText(b []byte) error {
	d.raw = string(b)
	return nil
}

func (d *Duration) parse() error {
	if d.raw == "" {
		return nil
	}
	v, err := time.ParseDuration(d.raw)
	d.Duration = v
	return err
}

// Tool is a tool an openai agent offers its model: convlog POSTs the
// call's arguments to URL and the JSON answer is the result.
type Tool struct {
	Name        string         `yaml:"name"`
	Description string         `yaml:"description"`
	Parameters  map[string]any `yaml:"parameters"`
	URL         string         `yaml:"url"`
	// AllowPrivate lets the call reach loopback and private networks;
	// without it a tool URL reaches public addresses only (docs/agents.md).
	AllowPrivate bool `yaml:"allowPrivate"`
	// Approval is none (the default) or required: a call of a required
	// tool waits for a person to approve it (docs/agents.md).
	Approval string `yaml:"approval"`
}

// Tool approval values.
const (
	ApprovalNone     = "none"
	ApprovalRequired = "required"
)

// Options are the per-agent settings the pool and transport apply.
func (a Agent) Options() worker.AgentOptions {
	busy, _ := worker.ParseBusyPolicy(a.Busy)
	approvals := false
	for _, t := range a.Tools {
		approvals = approvals || t.Approval == ApprovalRequired
	}
	return worker.AgentOptions{
		Kind: a.Kind, Busy: busy, Timeout: a.Timeout.Duration, MaxTurns: a.MaxTurns,
		Approvals: approvals, ApprovalTimeout: a.ApprovalTimeout.Duration,
	}
}

// Error is a problem of the file, at a line.
type Error struct {
	File  string
	Line  int    // 0 when unknown
	Field string // e.g. agents[1].kind
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Msg)
	return b.String()
}

// ErrInvalid is wrapped by every error of a file that was read.
var ErrInvalid = errors.New("invalid config")

func (e *Error) Unwrap() error { return ErrInvalid }

// Load reads and validates path.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data)
}

// MaxFileBytes bounds a config file: it lists agents, and a larger one is
// a mistake (or an attack), not a configuration.
const MaxFileBytes = 1 << 20

// MaxParametersBytes bounds the JSON a tool's parameters expand to. The
// schema is sent to the model on every turn: YAML aliases share nodes when
// decoded, so a 624-byte file of nested aliases (an alias bomb) decoded in
// microseconds and expanded to 636 MB at each turn.
const MaxParametersBytes = 256 << 10

// Parse validates data, the contents of the file named name.
func Parse(name string, data []byte) (_ *File, err error) {
	if len(data) > MaxFileBytes {
		return nil, &Error{File: name, Msg: fmt.Sprintf("the file is %d bytes, more than the %d a config file may have", len(data), MaxFileBytes)}
	}
	// The YAML library panics on some malformed input (found by fuzzing:
	// a tag where a sequence was expected); a bad file is an error.
	defer func() {
		if r := recover(); r != nil {
			err = &Error{File: name, Msg: fmt.Sprintf("not a YAML document this version can read (%v)", r)}
		}
	}()
	var f File
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.Strict()); err != nil {
		return nil, decodeError(name, err)
	}
	ast, _ := parser.ParseBytes(data, 0)
	at := func(path string) int { return line(ast, path) }
	if err := f.validate(name, at); err != nil {
		return nil, err
	}
	return &f, nil
}

// decodeError turns goccy's error (a multi-line, source-quoting message)
// into one line naming the file, line and field.
func decodeError(name string, err error) error {
	var ye yaml.Error
	if errors.As(err, &ye) {
		e := &Error{File: name, Msg: ye.GetMessage()}
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			e.Line = tk.Position.Line
			var unknown *yaml.UnknownFieldError
			if errors.As(err, &unknown) {
				e.Field = tk.Value
				e.Msg = "unknown key (check its spelling and that it belongs to this agent's kind)"
			}
		}
		return e
	}
	return &Error{File: name, Msg: err.Error()}
}

// line is the line of the node at a YAML path ($.agents[0].kind), or 0.
func line(f *ast.File, path string) int {
	if f == nil {
		return 0
	}
	p, err := yaml.PathString(path)
	if err != nil {
		return 0
	}
	n, err := p.FilterFile(f)
	if err != nil || n == nil || n.GetToken() == nil || n.GetToken().Position == nil {
		return 0
	}
	return n.GetToken().Position.Line
}

// kindFields are the kind-specific keys, by kind, as written in the file.
var kindFields = map[string][]string{
	KindEcho:   {"delay"},
	KindOpenAI: {"baseURL", "model", "apiKeyEnv", "system", "tools", "maxSteps", "maxAttempts", "temperature", "maxTokens", "toolTimeout"},
	KindHTTP:   {"url", "headers"},
	KindExec:   {"command", "dir", "env", "grace"},
}

func (f *File) validate(name string, at func(string) int) error {
	if len(f.Agents) == 0 && f.Auth == nil {
		return &Error{File: name, Line: at("$.agents"), Field: "agents", Msg: "the file lists no agents (and no auth section): nothing to configure"}
	}
	if f.Auth != nil {
		if err := f.Auth.Validate(); err != nil {
			// The section's errors start with the field they name.
			field, msg, ok := strings.Cut(err.Error(), ": ")
			if !ok || !strings.HasPrefix(field, "auth") {
				field, msg = "auth", err.Error()
			}
			l := 0
			for p := "$." + field; l == 0 && p != "$"; {
				l = at(p)
				j := strings.LastIndexAny(p, ".[")
				if j < 0 {
					break
				}
				p = p[:j]
			}
			return &Error{File: name, Line: l, Field: field, Msg: msg}
		}
	}
	seen := map[string]int{}
	for i, a := range f.Agents {
		path := fmt.Sprintf("$.agents[%d]", i)
		field := fmt.Sprintf("agents[%d]", i)
		bad := func(key, format string, args ...any) error {
			// An absent field is reported at its closest present parent.
			l := 0
			for p := path + "." + key; l == 0 && len(p) >= len(path); {
				l = at(p)
				j := strings.LastIndexAny(p, ".[")
				if j < 0 {
					break
				}
				p = p[:j]
			}
			return &Error{File: name, Line: l, Field: field + "." + key, Msg: fmt.Sprintf(format, args...)}
		}
		if a.Name == "" {
			return bad("name", "is required")
		}
		// Durations are parsed here, not by the decoder, so that a bad one
		// is reported at its line.
		for _, d := range []struct {
			key string
			dst *Duration
		}{{"timeout", &f.Agents[i].Timeout}, {"delay", &f.Agents[i].Delay}, {"toolTimeout", &f.Agents[i].ToolTimeout}, {"grace", &f.Agents[i].Grace}, {"approvalTimeout", &f.Agents[i].ApprovalTimeout}} {
			if err := d.dst.parse(); err != nil {
				return bad(d.key, "%q is not a duration (e.g. 30s, 10m, 1h30m)", d.dst.raw)
			}
		}
		a = f.Agents[i]
		if err := record.ValidateName(a.Name); err != nil {
			return bad("name", "%q: %v", a.Name, err)
		}
		if j, dup := seen[a.Name]; dup {
			return bad("name", "%q is also the name of agents[%d]", a.Name, j)
		}
		seen[a.Name] = i
		fields, ok := kindFields[a.Kind]
		if !ok {
			if a.Kind == "" {
				return bad("kind", "is required (openai, http, exec or echo)")
			}
			return bad("kind", "unknown kind %q (want openai, http, exec or echo)", a.Kind)
		}
		if _, err := worker.ParseBusyPolicy(a.Busy); err != nil {
			return bad("busy", "%v", err)
		}
		if a.Timeout.Duration < 0 {
			return bad("timeout", "must not be negative")
		}
		if a.MaxTurns < 0 {
			return bad("maxTurns", "must not be negative")
		}
		if a.ApprovalTimeout.Duration < 0 {
			return bad("approvalTimeout", "must not be negative")
		}
		if a.Kind == KindEcho && at(path+".approvalTimeout") > 0 {
			return bad("approvalTimeout", "is not a field of kind echo: an echo agent never asks for approval")
		}
		for kind, keys := range kindFields {
			if kind == a.Kind {
				continue
			}
			for _, k := range keys {
				if at(path+"."+k) > 0 && !contains(fields, k) {
					return bad(k, "is not a field of kind %s (it belongs to kind %s)", a.Kind, kind)
				}
			}
		}
		switch a.Kind {
		case KindOpenAI:
			if a.Model == "" {
				return bad("model", "is required for kind openai")
			}
			if a.BaseURL != "" && !isHTTPURL(a.BaseURL) {
				return bad("baseURL", "%q is not an http(s) URL", a.BaseURL)
			}
			if a.MaxSteps < 0 || a.MaxAttempts < 0 || a.MaxTokens < 0 || a.ToolTimeout.Duration < 0 {
				return bad("maxSteps", "maxSteps, maxAttempts, maxTokens and toolTimeout must not be negative")
			}
			tools := map[string]bool{}
			for j, t := range a.Tools {
				tp := fmt.Sprintf("tools[%d]", j)
				if t.Name == "" {
					return bad(tp+".name", "is required")
				}
				if tools[t.Name] {
					return bad(tp+".name", "tool %q is declared twice", t.Name)
				}
				tools[t.Name] = true
				if !isHTTPURL(t.URL) {
					return bad(tp+".url", "is required: the http(s) URL convlog POSTs the arguments to")
				}
				switch t.Approval {
				case "", ApprovalNone, ApprovalRequired:
				default:
					return bad(tp+".approval", "unknown value %q (want none or required)", t.Approval)
				}
				if !withinBytes(t.Parameters, MaxParametersBytes) {
					return bad(tp+".parameters", "expands to more than %d bytes of JSON (YAML aliases are expanded: each alias counts as a copy of what it names)", MaxParametersBytes)
				}
			}
		case KindHTTP:
			if !isHTTPURL(a.URL) {
				return bad("url", "is required for kind http: an http(s) URL")
			}
		case KindExec:
			if len(a.Command) == 0 || a.Command[0] == "" {
				return bad("command", "is required for kind exec: the program and its arguments, e.g. [\"python3\", \"agent.py\"]")
			}
			if a.Grace.Duration < 0 {
				return bad("grace", "must not be negative")
			}
		case KindEcho:
			if a.Delay.Duration < 0 {
				return bad("delay", "must not be negative")
			}
		}
	}
	return nil
}

// withinBytes says whether v, encoded as JSON, is at most limit bytes,
// roughly (keys and strings are counted as written, other scalars as 8).
// The walk stops as soon as the budget is spent, so that an alias bomb
// costs no more than the limit to refuse.
func withinBytes(v any, limit int) bool {
	left := limit
	var walk func(v any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case map[string]any:
			left -= 2
			for k, e := range v {
				if left -= len(k) + 4; left < 0 || !walk(e) {
					return false
				}
			}
		case map[any]any:
			left -= 2
			for _, e := range v {
				if left -= 12; left < 0 || !walk(e) {
					return false
				}
			}
		case []any:
			left -= 2
			for _, e := range v {
				if left--; left < 0 || !walk(e) {
					return false
				}
			}
		case string:
			left -= len(v) + 2
		default:
			left -= 8
		}
		return left >= 0
	}
	return walk(v)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func isHTTPURL(s string) bool {
	return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
}
