package service

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/transport"
)

// Defaults of `convlog serve`.
const (
	DefaultListen          = "127.0.0.1:8080"
	DefaultData            = "./data"
	DefaultEchoDelay       = 20 * time.Millisecond
	DefaultShutdownTimeout = 10 * time.Second
)

// ErrExposed: the service would listen beyond loopback with no access
// control, and the operator did not say --insecure.
var ErrExposed = errors.New("refusing to serve beyond loopback without access control")

// checkExposure refuses a non-loopback listen address unless access
// control is configured or the operator insists (Insecure, logged).
func checkExposure(cfg Config) error {
	if err := checkNATSExposure(cfg); err != nil {
		return err
	}
	if (cfg.Auth != nil && cfg.Auth.Enabled()) || loopbackOnly(cfg.Listen) {
		return nil
	}
	if cfg.Insecure {
		if cfg.Logger != nil {
			cfg.Logger.Warn("serving beyond loopback WITHOUT access control (--insecure): anyone who reaches the port can read and write every conversation", "listen", cfg.Listen)
		}
		return nil
	}
	return fmt.Errorf("%w: --listen %s reaches other machines; configure auth in the config file (docs/security.md) or pass --insecure", ErrExposed, cfg.Listen)
}

// ErrBrokerExposed: the embedded broker would listen where others can
// connect without credentials (or, beyond loopback, without TLS). No flag
// overrides it: whoever connects reads and writes every conversation.
var ErrBrokerExposed = errors.New("refusing to open the embedded NATS without credentials")

// checkNATSExposure refuses an embedded broker's port beyond loopback
// without a worker password and TLS, and any port without a worker
// password while access control is on (the port would let any local user
// around it).
func checkNATSExposure(cfg Config) error {
	if cfg.NATSURL != "" || cfg.NATSListen == "" {
		return nil
	}
	tls := cfg.NATSTLSCert != "" && cfg.NATSTLSKey != ""
	if (cfg.NATSTLSCert == "") != (cfg.NATSTLSKey == "") {
		return fmt.Errorf("%w: --nats-tls-cert and --nats-tls-key go together", ErrBrokerExposed)
	}
	switch {
	case !loopbackOnly(cfg.NATSListen) && (cfg.NATSWorkerPassword == "" || !tls):
		return fmt.Errorf("%w: --nats-listen %s reaches other machines; give the workers' password (--nats-worker-password-file or CONVLOG_NATS_WORKER_PASSWORD) and --nats-tls-cert/--nats-tls-key (docs/security.md#the-broker)", ErrBrokerExposed, cfg.NATSListen)
	case cfg.NATSWorkerPassword == "" && cfg.Auth != nil && cfg.Auth.Enabled():
		return fmt.Errorf("%w: --nats-listen %s with access control on; give the workers' password (--nats-worker-password-file or CONVLOG_NATS_WORKER_PASSWORD; docs/security.md#the-broker)", ErrBrokerExposed, cfg.NATSListen)
	}
	return nil
}

// loopbackOnly reports whether addr can only be reached from this machine.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// authenticator is the transport's view of s.auth: a nil interface when
// access control is off (not an interface holding a nil pointer).
func (s *Service) authenticator() transport.Authenticator {
	if s.auth == nil {
		return nil
	}
	return s.auth
}

func authLimits(c *auth.Config) auth.Limits {
	if c == nil {
		return auth.Limits{}
	}
	return c.Limits
}
