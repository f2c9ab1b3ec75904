package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/convlog/convlog/internal/config"
	"github.com/convlog/convlog/worker"
)

const good = `agents:
  - name: support            # the :name in /agents/:name/:instanceId
    kind: openai
    busy: join
    timeout: 10m
    maxTurns: 0
    baseURL: http://127.0.0.1:11434/v1
    model: llama3.2
    apiKeyEnv: OPENAI_API_KEY
    system: "You are a helpful support agent."
    tools:
      - name: lookup
        description: look an order up
        parameters: {type: object, properties: {id: {type: string}}}
        url: http://127.0.0.1:9001/lookup
        allowPrivate: true
  - name: remote
    kind: http
    url: http://127.0.0.1:9000/invoke
  - name: script
    kind: exec
    busy: enqueue
    command: ["python3", "agents/triage.py"]
    dir: .
    env: {LANG: C.UTF-8}
`

func TestParseGood(t *testing.T) {
	f, err := config.Parse("convlog.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Agents) != 3 {
		t.Fatalf("%+v", f)
	}
	a := f.Agents[0]
	if a.Timeout.Duration != 10*time.Minute || a.Model != "llama3.2" || a.Tools[0].URL == "" || !a.Tools[0].AllowPrivate || a.Tools[0].Parameters["type"] != "object" {
		t.Fatalf("%+v", a)
	}
	if o := f.Agents[2].Options(); o.Busy != worker.BusyJoin || o.Kind != "exec" {
		t.Fatalf("enqueue is join: %+v", o)
	}
	if f.Agents[2].Env["LANG"] != "C.UTF-8" || f.Agents[2].Command[1] != "agents/triage.py" {
		t.Fatalf("%+v", f.Agents[2])
	}
}

// A tool may require approval; approvalTimeout bounds the wait. Both
// reach the agent's options.
func TestParseApprovals(t *testing.T) {
	f, err := config.Parse("convlog.yaml", []byte(`agents:
  - name: refunds
    kind: openai
    model: m
    approvalTimeout: 30m
    tools:
      - {name: lookup, url: "http://x/lookup", approval: none}
      - {name: refund, url: "http://x/refund", approval: required}
  - name: plain
    kind: openai
    model: m
    tools:
      - {name: lookup, url: "http://x/lookup"}
  - name: remote
    kind: exec
    command: [x]
    approvalTimeout: 1h
`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []worker.AgentOptions{
		{Kind: "openai", Busy: worker.BusyJoin, Approvals: true, ApprovalTimeout: 30 * time.Minute},
		{Kind: "openai", Busy: worker.BusyJoin},
		{Kind: "exec", Busy: worker.BusyJoin, ApprovalTimeout: time.Hour},
	} {
		if got := f.Agents[i].Options(); got != want {
			t.Errorf("agents[%d]: %+v, want %+v", i, got, want)
		}
	}
	if tl := f.Agents[0].Tools; tl[0].Approval != config.ApprovalNone || tl[1].Approval != config.ApprovalRequired {
		t.Fatalf("%+v", tl)
	}
}

// The auth section (docs/security.md) sits beside the agents; alone, it
// serves echo with access control.
func TestParseAuth(t *testing.T) {
	f, err := config.Parse("convlog.yaml", []byte(`auth:
  tokens:
    - sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      principal: ops
      scopes: ["read:*/*", "deliver:*/*"]
  limits: {deliveriesPerSecond: 5, burst: 20, streams: 20}
`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Auth == nil || !f.Auth.Enabled() || f.Auth.Tokens[0].Principal != "ops" || f.Auth.Limits.Burst != 20 || len(f.Agents) != 0 {
		t.Fatalf("%+v", f)
	}
}

func TestParseBad(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown kind", "agents:\n  - name: a\n    kind: grpc\n", `convlog.yaml:3: agents[0].kind: unknown kind "grpc"`},
		{"missing kind", "agents:\n  - name: a\n", `convlog.yaml:2: agents[0].kind: is required`},
		{"missing field", "agents:\n  - name: a\n    kind: http\n", `convlog.yaml:2: agents[0].url: is required`},
		{"missing model", "agents:\n  - name: a\n    kind: openai\n", `agents[0].model: is required`},
		{"unknown key", "agents:\n  - name: a\n    kind: echo\n    colour: red\n", `convlog.yaml:4: colour: unknown key`},
		{"unknown top-level key", "agentz: []\n", `convlog.yaml:1: agentz: unknown key`},
		{"bad duration", "agents:\n  - name: a\n    kind: echo\n    timeout: 10 minutes\n", `convlog.yaml:4: agents[0].timeout: "10 minutes" is not a duration`},
		{"duplicate name", "agents:\n  - name: a\n    kind: echo\n  - name: a\n    kind: echo\n", `convlog.yaml:4: agents[1].name: "a" is also the name of agents[0]`},
		{"invalid name", "agents:\n  - name: a/b\n    kind: echo\n", `convlog.yaml:2: agents[0].name: "a/b"`},
		{"bad busy", "agents:\n  - name: a\n    kind: echo\n    busy: later\n", `convlog.yaml:4: agents[0].busy: unknown busy policy "later"`},
		{"field of another kind", "agents:\n  - name: a\n    kind: http\n    url: http://x\n    command: [x]\n", `convlog.yaml:5: agents[0].command: is not a field of kind http`},
		{"tool without url", "agents:\n  - name: a\n    kind: openai\n    model: m\n    tools:\n      - name: t\n", `convlog.yaml:6: agents[0].tools[0].url: is required`},
		{"exec without command", "agents:\n  - name: a\n    kind: exec\n", `agents[0].command: is required`},
		{"nothing", "agents: []\n", `convlog.yaml:1: agents: the file lists no agents`},
		{"bad auth token", "auth:\n  tokens:\n    - sha256: abc\n      principal: ops\n", `convlog.yaml:3: auth.tokens[0].sha256: want 64 lowercase hex digits`},
		{"auth without issuer", "auth:\n  jwt:\n    audience: convlog\n    jwks: keys.json\n", `convlog.yaml:3: auth.jwt.issuer: required`},
		{"unknown auth key", "auth:\n  tokenz: []\n", `convlog.yaml:2: tokenz: unknown key`},
		{"not yaml", "agents: [\n", `convlog.yaml`},
		{"alias bomb in parameters", aliasBomb("[x, x, x, x, x, x, x, x, x, x]"), `convlog.yaml:9: agents[0].tools[0].parameters: expands to more than`},
		{"alias bomb of maps", aliasBomb("{k0: x, k1: x, k2: x, k3: x, k4: x, k5: x, k6: x, k7: x, k8: x, k9: x}"), `agents[0].tools[0].parameters: expands to more than`},
		{"bad approval", "agents:\n  - name: a\n    kind: openai\n    model: m\n    tools:\n      - name: t\n        url: http://x/\n        approval: maybe\n", `convlog.yaml:8: agents[0].tools[0].approval: unknown value "maybe" (want none or required)`},
		{"bad approvalTimeout", "agents:\n  - name: a\n    kind: http\n    url: http://x/\n    approvalTimeout: a day\n", `convlog.yaml:5: agents[0].approvalTimeout: "a day" is not a duration`},
		{"negative approvalTimeout", "agents:\n  - name: a\n    kind: openai\n    model: m\n    approvalTimeout: -1m\n", `convlog.yaml:5: agents[0].approvalTimeout: must not be negative`},
		{"approvalTimeout on echo", "agents:\n  - name: a\n    kind: echo\n    approvalTimeout: 30m\n", `convlog.yaml:4: agents[0].approvalTimeout: is not a field of kind echo`},
		{"file too large", "agents:\n  - name: a\n    kind: echo\n" + strings.Repeat("# padding\n", config.MaxFileBytes/10), `convlog.yaml: the file is`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse("convlog.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Errorf("not ErrInvalid: %T %v", err, err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "convlog.yaml") || !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Fatalf("got  %q\nwant %q in one line", msg, tc.want)
			}
		})
	}
}

// aliasBomb is a tool whose parameters nest ten aliases six deep: a few
// hundred bytes that name a million copies of leaf.
func aliasBomb(leaf string) string {
	y := "agents:\n  - name: o\n    kind: openai\n    model: m\n    tools:\n      - name: t\n        url: http://x/\n        parameters:\n          a: &a " + leaf + "\n"
	for _, l := range []string{"b", "c", "d", "e", "f"} {
		prev := string(rune(l[0] - 1))
		y += "          " + l + ": &" + l + " [" + strings.TrimSuffix(strings.Repeat("*"+prev+", ", 10), ", ") + "]\n"
	}
	return y
}
