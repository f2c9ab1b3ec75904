package service

import (
	"github.com/convlog/convlog/log/record"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/worker/natsbus"
)

// deltaSource adapts the worker's NATS delta bus to what the HTTP layer
// consumes; neither package knows the other.
type deltaSource struct{ bus *natsbus.DeltaBus }

func (d deltaSource) FollowDeltas(key record.Key) (transport.DeltaCursor, error) {
	return d.bus.FollowDeltas(key)
}
