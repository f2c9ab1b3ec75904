package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/convlog/convlog/worker/natsbus"
)

// Environment variables that carry NATS secrets, for those who would
// rather not keep them in a file. A secret is never a flag's value: ps
// shows a command line to every user of the machine.
const (
	envNATSPassword       = "CONVLOG_NATS_PASSWORD"
	envNATSToken          = "CONVLOG_NATS_TOKEN"
	envNATSWorkerPassword = "CONVLOG_NATS_WORKER_PASSWORD"
)

// natsClientFlags are how a process presents itself to a NATS it dials
// (a worker to the service's broker, the service to an external one).
type natsClientFlags struct {
	user, passwordFile, creds, nkey, ca string
	defaultUser                         string
}

func addNATSClientFlags(fs *flag.FlagSet, defaultUser string) *natsClientFlags {
	f := &natsClientFlags{defaultUser: defaultUser}
	fs.StringVar(&f.user, "nats-user", "", "NATS user name (default "+orNone(defaultUser)+" when a password is given)")
	fs.StringVar(&f.passwordFile, "nats-password-file", "", "file holding the NATS user's password (or set "+envNATSPassword+"; a bare token: "+envNATSToken+")")
	fs.StringVar(&f.creds, "nats-creds", "", "NATS .creds file (user JWT and nkey seed), for a broker with operator/accounts")
	fs.StringVar(&f.nkey, "nats-nkey", "", "file holding a NATS user nkey seed (SU...)")
	fs.StringVar(&f.ca, "nats-tls-ca", "", "PEM file of the CA that signed the broker's certificate (TLS)")
	return f
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (f *natsClientFlags) credentials() (natsbus.Credentials, error) {
	c := natsbus.Credentials{User: f.user, CredsFile: f.creds, NkeySeedFile: f.nkey, TLSCA: f.ca}
	switch {
	case f.passwordFile != "":
		p, err := natsbus.ReadSecret(f.passwordFile)
		if err != nil {
			return c, fmt.Errorf("--nats-password-file: %w", err)
		}
		c.Password = p
	case os.Getenv(envNATSPassword) != "":
		c.Password = os.Getenv(envNATSPassword)
	}
	if c.Password != "" && c.User == "" {
		c.User = f.defaultUser
	}
	if c.User == "" {
		c.Token = os.Getenv(envNATSToken)
	}
	if c.Password == "" && c.User != "" && c.CredsFile == "" && c.NkeySeedFile == "" {
		return c, fmt.Errorf("%w: --nats-user %s without a password (--nats-password-file or %s)", natsbus.ErrCredentials, c.User, envNATSPassword)
	}
	return c, nil
}

// workerPassword is the password the embedded broker lets workers in by.
func workerPassword(file string) (string, error) {
	if file != "" {
		p, err := natsbus.ReadSecret(file)
		if err != nil {
			return "", fmt.Errorf("--nats-worker-password-file: %w", err)
		}
		return p, nil
	}
	return os.Getenv(envNATSWorkerPassword), nil
}
