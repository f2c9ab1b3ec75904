package worker

import (
	"strings"

	clog "github.com/convlog/convlog/log"
)

// NATS names. Submissions go to one JetStream stream, a subject per agent;
// deltas go to core subjects, one per conversation.
const (
	StreamName     = "CONVLOG_SUBMISSIONS"
	ConsumerName   = "convlog-workers"
	submitPrefix   = "convlog.submissions."
	deltaPrefix    = "convlog.live."
	deltaWildcard  = deltaPrefix + ">"
	submitWildcard = submitPrefix + ">"
)

// token makes a name safe as one subject token. Names may hold '.', the
// token separator; they never hold '%', so this escape is reversible.
func token(name string) string { return strings.ReplaceAll(name, ".", "%2E") }

func submitSubject(agent string) string { return submitPrefix + token(agent) }

func deltaSubject(k clog.Key) string {
	return deltaPrefix + token(k.Agent) + "." + token(k.Instance) + "." + token(k.Session)
}
