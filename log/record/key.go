package record

import (
	"fmt"
)

// MaxNameLength bounds agent, instance and session names.
const MaxNameLength = 128

// Key addresses one stream: a session of an agent instance.
type Key struct {
	Agent    string
	Instance string
	Session  string
}

// DefaultSession is the session of a delivery that names none.
const DefaultSession = "default"

func (k Key) String() string { return k.Agent + "/" + k.Instance + "/" + k.Session }

// Validate reports an ErrInvalidName for any part outside the name rules.
func (k Key) Validate() error {
	for _, p := range [...]struct{ what, name string }{
		{"agent", k.Agent}, {"instance", k.Instance}, {"session", k.Session},
	} {
		if err := ValidateName(p.name); err != nil {
			return fmt.Errorf("%s: %w", p.what, err)
		}
	}
	return nil
}

// ValidateName checks one name: 1 to 128 characters of ASCII letters,
// digits, '.', '_', '-', ':' and '@', starting with a letter or digit. The
// set is conservative so that a name is safe in a URL path, a NATS subject
// token (after escaping '.') and a log line.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	if len(name) > MaxNameLength {
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidName, MaxNameLength)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-' || c == ':' || c == '@'):
		default:
			return fmt.Errorf("%w: %q has a disallowed character at %d", ErrInvalidName, truncate(name), i)
		}
	}
	return nil
}
