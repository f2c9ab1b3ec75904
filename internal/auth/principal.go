package auth

import "time"

// Principal is an authenticated caller.
type Principal struct {
	// Issuer is the JWT's iss; "" for a static token.
	Issuer string `json:"issuer,omitempty"`
	// Subject is the JWT's sub, or a static token's principal name.
	Subject string `json:"subject"`
	// Scopes are what it may do.
	Scopes []Scope `json:"-"`
	// Expires is when its token stops being valid; zero for never.
	Expires time.Time `json:"-"`
}

// Allows reports whether the principal may do verb on agent/instance. For
// VerbAdmin, agent and instance are ignored.
func (p Principal) Allows(verb Verb, agent, instance string) bool {
	for _, s := range p.Scopes {
		if s.allows(verb, agent, instance, p.Subject) {
			return true
		}
	}
	return false
}

// AllowsAgent reports whether the principal may do verb on some instance
// of agent: whether a listing of agent can show it anything. The listing
// still filters each instance with Allows.
func (p Principal) AllowsAgent(verb Verb, agent string) bool {
	for _, s := range p.Scopes {
		if s.Verb == verb && match(s.Agent, agent, "") {
			return true
		}
	}
	return false
}

// Expired reports whether the principal's token has expired at now.
func (p Principal) Expired(now time.Time) bool {
	return !p.Expires.IsZero() && !now.Before(p.Expires)
}
