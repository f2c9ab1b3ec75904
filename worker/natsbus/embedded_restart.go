package natsbus

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"
)

// RestartJetStream stops and starts the embedded server's JetStream, which
// reloads every stream and consumer from its store. nats-server's file
// store keeps the first write error it meets (a full disk, say) and fails
// every later write with it, so a stream that met one stays dead until its
// store is reopened; client connections and durable consumers survive.
func (e *Embedded) RestartJetStream() error {
	cfg := e.Server.JetStreamConfig()
	if cfg == nil {
		return errors.New("embedded nats: jetstream not enabled")
	}
	// The server reports the folder it stores in, which is the one it was
	// given plus "jetstream", and appends that again when enabled.
	if filepath.Base(cfg.StoreDir) == server.JetStreamStoreDir {
		cfg.StoreDir = filepath.Dir(cfg.StoreDir)
	}
	if err := e.Server.ShutdownJetStream(); err != nil {
		return fmt.Errorf("embedded nats: stop jetstream: %w", err)
	}
	if err := e.Server.EnableJetStream(cfg); err != nil {
		return fmt.Errorf("embedded nats: start jetstream: %w", err)
	}
	return nil
}
