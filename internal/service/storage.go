package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/worker/natsbus"
)

// logReserve is the room the log wants beyond the embedded broker's store
// at start: bbolt grows its file 16 MiB at a time.
const logReserve = 32 << 20

// diskNeed is the free space a data folder should have at start.
const diskNeed = natsbus.EmbeddedMaxStore + logReserve

// portFree checks that addr can be listened on. The embedded NATS listens
// only once it starts, after the data folder exists; a clash found then
// would leave the folder behind.
func portFree(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return l.Close()
}

// checkDisk warns at start when the data folder's file system has less
// room than the embedded broker's store may take plus the log's next
// growth: the service starts (the log still admits), and readiness says
// what is missing once a write or the broker fails.
func (s *Service) checkDisk() {
	free, err := clog.FreeSpace(s.cfg.Data)
	if err != nil {
		s.logger.Warn("cannot tell the free disk space of the data folder", "data", s.cfg.Data, "err", err)
		return
	}
	if free < diskNeed {
		s.logger.Error("the data folder has less free disk space than convlog needs: free some, or move --data to a bigger volume",
			"data", s.cfg.Data, "free_mib", free>>20, "need_mib", diskNeed>>20,
			"why", fmt.Sprintf("the embedded JetStream store may take %d MiB and the log grows %d MiB at a time",
				natsbus.EmbeddedMaxStore>>20, 16))
	}
}

// storageReady is readiness's storage part: the log takes writes (not a
// full disk, not a damaged file) and the embedded broker's JetStream is on.
func (s *Service) storageReady() error {
	if err := s.db.Health(); err != nil {
		return fmt.Errorf("log not writable: %w", err)
	}
	if s.emb != nil && !s.emb.Server.JetStreamEnabled() {
		return errors.New("the embedded JetStream is disabled (its store failed, as on a full disk); restart convlog once there is space")
	}
	return nil
}

// embeddedStoreHint adds to a failing relay's readiness message what
// happens about the embedded broker. Its file store keeps the first write
// error it meets (nats-server's filestore: the error is sticky), so once a
// full disk has failed a write, publishing times out even after space is
// freed (measured on a tmpfs), until JetStream restarts (watchEmbedded).
func (s *Service) embeddedStoreHint() string {
	if s.emb == nil {
		return ""
	}
	return "; the embedded JetStream is restarted after 15s of this (a store that met a full disk stays failed until then)"
}

// Watching the embedded broker: a relay failing this long against an
// in-process broker (no network to blame) is a JetStream store that met a
// write error, and restarting JetStream is what revives it.
const (
	embeddedFailingFor = 15 * time.Second
	embeddedRestartGap = time.Minute
)

// watchEmbedded restarts the embedded JetStream when the relay has failed
// for embeddedFailingFor while the log takes writes and the disk has room,
// at most once per embeddedRestartGap. It logs why.
func (s *Service) watchEmbedded(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var failingSince, lastRestart time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.relay.Healthy()
		if err == nil {
			failingSince = time.Time{}
			continue
		}
		now := time.Now()
		if failingSince.IsZero() {
			failingSince = now
		}
		if now.Sub(failingSince) < embeddedFailingFor || now.Sub(lastRestart) < embeddedRestartGap || s.db.Health() != nil {
			continue
		}
		if free, ferr := clog.FreeSpace(s.cfg.Data); ferr == nil && free < logReserve {
			continue // a restart would meet the same full disk
		}
		lastRestart = now
		s.logger.Warn("embedded JetStream failing; restarting it (its store keeps write errors such as a full disk's)",
			"failing for", now.Sub(failingSince).Round(time.Second), "err", err)
		if rerr := s.emb.RestartJetStream(); rerr != nil {
			s.logger.Error("embedded JetStream restart failed; restart convlog", "err", rerr)
			continue
		}
		s.logger.Info("embedded JetStream restarted")
	}
}
