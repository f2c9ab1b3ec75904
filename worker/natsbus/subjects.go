package natsbus

import (
	"fmt"
	"strings"

	"github.com/convlog/convlog/log/record"
)

// Namespace prefixes every NATS name convlog uses, so that several
// deployments (or test runs) can share one broker without taking each
// other's work. The default is "convlog".
type Namespace string

// DefaultNamespace is the namespace of a deployment that names none.
const DefaultNamespace Namespace = "convlog"

// Validate accepts 1 to 32 of [a-z0-9_-]: safe in subjects and stream names.
func (ns Namespace) Validate() error {
	if len(ns) == 0 || len(ns) > 32 {
		return fmt.Errorf("nats namespace %q: 1 to 32 characters", string(ns))
	}
	for _, c := range []byte(ns) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("nats namespace %q: only a-z, 0-9, _ and -", string(ns))
		}
	}
	return nil
}

func (ns Namespace) orDefault() Namespace {
	if ns == "" {
		return DefaultNamespace
	}
	return ns
}

// StreamName is the JetStream stream of admitted submissions.
func (ns Namespace) StreamName() string {
	return strings.ToUpper(strings.ReplaceAll(string(ns.orDefault()), "-", "_")) + "_SUBMISSIONS"
}

func (ns Namespace) leaseBucket() string {
	return strings.ReplaceAll(string(ns.orDefault()), "-", "_") + "_leases"
}

// ConsumerName is the workers' durable consumer.
func (ns Namespace) ConsumerName() string { return string(ns.orDefault()) + "-workers" }

func (ns Namespace) submitWildcard() string { return string(ns.orDefault()) + ".submissions.>" }

func (ns Namespace) submitSubject(agent string) string {
	return string(ns.orDefault()) + ".submissions." + token(agent)
}

func (ns Namespace) deltaWildcard() string { return string(ns.orDefault()) + ".live.>" }

func (ns Namespace) deltaSubject(k record.Key) string {
	return string(ns.orDefault()) + ".live." + token(k.Agent) + "." + token(k.Instance) + "." + token(k.Session)
}

// token makes a name safe as one subject token. Names may hold '.', the
// token separator; they never hold '%', so this escape is reversible.
func token(name string) string { return strings.ReplaceAll(name, ".", "%2E") }

// LogSubject is the request subject of one operation of the log's owner,
// answered for remote workers (package worker/remote).
func (ns Namespace) LogSubject(op string) string {
	return string(ns.orDefault()) + ".log." + token(op)
}

// AbortSubject is where the log's owner asks the remote workers to cancel
// a running turn.
func (ns Namespace) AbortSubject() string { return string(ns.orDefault()) + ".abort" }
