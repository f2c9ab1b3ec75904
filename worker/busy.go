package worker

import (
	"fmt"
	"time"
)

// BusyPolicy says what happens to a delivery to a session that has a turn
// running or submissions waiting. It is the one definition of the concept:
// the pool, the HTTP transport and the config file all use these values.
type BusyPolicy string

// Busy policies.
const (
	// BusyJoin admits it; the next turn answers every submission that
	// waits, together (answeredBySubmissionId). The default.
	BusyJoin BusyPolicy = "join"
	// BusyQueue admits it; each submission gets a turn of its own, in
	// admission order.
	BusyQueue BusyPolicy = "queue"
	// BusyReject refuses it: 409 session_busy.
	BusyReject BusyPolicy = "reject"
	// BusyInterrupt admits it and aborts every earlier unsettled
	// submission of the session (the running turn is cancelled and
	// settled aborted); then the new one runs.
	BusyInterrupt BusyPolicy = "interrupt"

	// BusyEnqueue is the former name of BusyJoin, still accepted.
	//
	// Deprecated: use BusyJoin.
	BusyEnqueue BusyPolicy = "enqueue"
)

// ParseBusyPolicy reads a policy name: "" is BusyJoin, and the deprecated
// "enqueue" is normalised to BusyJoin.
func ParseBusyPolicy(s string) (BusyPolicy, error) {
	switch p := BusyPolicy(s); p {
	case "", BusyEnqueue:
		return BusyJoin, nil
	case BusyJoin, BusyQueue, BusyReject, BusyInterrupt:
		return p, nil
	}
	return "", fmt.Errorf("unknown busy policy %q (want join, queue, reject or interrupt)", s)
}

// OneAtATime reports whether each turn answers exactly one submission.
func (p BusyPolicy) OneAtATime() bool { return p == BusyQueue || p == BusyInterrupt }

// AgentOptions are the per-agent settings the pool and transport apply
// around an Agent, whatever its kind.
type AgentOptions struct {
	// Kind is informational ("echo", "openai", "http", "exec"): GET /agents.
	Kind string
	// Busy is the busy policy; "" is BusyJoin.
	Busy BusyPolicy
	// Timeout bounds a turn: past it the turn is cancelled and settled
	// failed, code deadline_exceeded. 0 is no limit.
	Timeout time.Duration
	// MaxTurns bounds the deliveries one session accepts: past it a
	// delivery is refused, 409 turn_limit_reached. 0 is no limit.
	MaxTurns int
	// Approvals says that the agent is configured to ask a person to
	// approve tool calls (an openai agent with a tool of approval:
	// required). Whatever it says, a turn that emits approval_requested
	// (an http or exec agent may at any time) stops, and its submission
	// waits as input_required until every request is decided; then the
	// same submission is invoked again with Prompt.Resume.
	Approvals bool
	// ApprovalTimeout bounds that wait: what is still undecided when it
	// expires is denied with reason "timeout" (ReasonTimeout), and the
	// submission resumes. 0 is no limit.
	ApprovalTimeout time.Duration
}

// AgentInfo is what GET /agents shows of an agent: never its secrets.
type AgentInfo struct {
	Name string     `json:"name"`
	Kind string     `json:"kind"`
	Busy BusyPolicy `json:"busy"`
}
