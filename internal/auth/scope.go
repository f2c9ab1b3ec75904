package auth

import (
	"errors"
	"fmt"
	"strings"

	"github.com/convlog/convlog/log/record"
)

// Verb is what a scope allows.
type Verb string

// Verbs. Admin is a scope of its own ("admin"); the others apply to an
// agent and instance pattern ("read:support/*").
const (
	VerbRead    Verb = "read"    // read conversations, submissions, listings
	VerbDeliver Verb = "deliver" // deliver messages
	VerbAbort   Verb = "abort"   // abort submissions
	VerbManage  Verb = "manage"  // rewind, regenerate, fork, reset, delete
	VerbApprove Verb = "approve" // decide a submission's pending tool approvals
	VerbAdmin   Verb = "admin"   // backup, metrics when protected
)

// ErrInvalidScope: a scope string that is not of the documented form.
var ErrInvalidScope = errors.New("invalid scope")

// SubjectPattern in an instance pattern stands for the principal's own
// subject: "read:support/{sub}" lets each end user read the instance named
// after them.
const SubjectPattern = "{sub}"

// Scope is one parsed scope: a verb on an agent pattern and an instance
// pattern. A pattern is "*" (any), SubjectPattern (instance only), or a
// literal name; a literal may end in "*" for a prefix ("customer-*").
type Scope struct {
	Verb     Verb
	Agent    string
	Instance string
}

func (s Scope) String() string {
	if s.Verb == VerbAdmin {
		return string(VerbAdmin)
	}
	return string(s.Verb) + ":" + s.Agent + "/" + s.Instance
}

// ParseScope reads "admin" or "VERB:AGENT/INSTANCE".
func ParseScope(s string) (Scope, error) {
	if s == string(VerbAdmin) {
		return Scope{Verb: VerbAdmin}, nil
	}
	verb, rest, ok := strings.Cut(s, ":")
	if !ok {
		return Scope{}, fmt.Errorf("%w %q: want admin or verb:agent/instance", ErrInvalidScope, record.Clip(s, 60))
	}
	switch Verb(verb) {
	case VerbRead, VerbDeliver, VerbAbort, VerbManage, VerbApprove:
	default:
		return Scope{}, fmt.Errorf("%w %q: unknown verb %q (read, deliver, abort, manage or admin)", ErrInvalidScope, record.Clip(s, 60), record.Clip(verb, 60))
	}
	agent, instance, ok := strings.Cut(rest, "/")
	if !ok || agent == "" || instance == "" || strings.Contains(instance, "/") {
		return Scope{}, fmt.Errorf("%w %q: want %s:agent/instance", ErrInvalidScope, record.Clip(s, 60), verb)
	}
	if agent == SubjectPattern {
		return Scope{}, fmt.Errorf("%w %q: %s stands for an instance, not an agent", ErrInvalidScope, record.Clip(s, 60), SubjectPattern)
	}
	for _, p := range []string{agent, instance} {
		if p == "*" || p == SubjectPattern {
			continue
		}
		name := strings.TrimSuffix(p, "*")
		if name == "" || strings.ContainsAny(name, "*{}") || !validName(name) {
			return Scope{}, fmt.Errorf("%w %q: %q is not a name, a name*, * or %s", ErrInvalidScope, record.Clip(s, 60), record.Clip(p, 60), SubjectPattern)
		}
	}
	return Scope{Verb: Verb(verb), Agent: agent, Instance: instance}, nil
}

// ParseScopes parses each scope; the first bad one is the error.
func ParseScopes(ss []string) ([]Scope, error) {
	out := make([]Scope, 0, len(ss))
	for _, s := range ss {
		sc, err := ParseScope(s)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, nil
}

// allows reports whether s grants verb on agent/instance to a principal
// whose subject is sub.
func (s Scope) allows(verb Verb, agent, instance, sub string) bool {
	if s.Verb == VerbAdmin {
		return verb == VerbAdmin
	}
	return s.Verb == verb && match(s.Agent, agent, "") && match(s.Instance, instance, sub)
}

func match(pattern, name, sub string) bool {
	switch {
	case pattern == "*":
		return true
	case pattern == SubjectPattern:
		return sub != "" && name == sub
	case strings.HasSuffix(pattern, "*"):
		return strings.HasPrefix(name, pattern[:len(pattern)-1])
	default:
		return name == pattern
	}
}

// validName is the log's name rule (letters, digits and . _ - : @), so a
// scope can only name what can exist.
func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.' || c == '_' || c == '-' || c == ':' || c == '@':
		default:
			return false
		}
	}
	return len(s) <= 128
}
