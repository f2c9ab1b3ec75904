package main

import (
	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/transport"
	"github.com/convlog/convlog/worker"
)

// deltaSource adapts the worker's NATS delta bus to what the HTTP layer
// consumes; neither package knows the other.
type deltaSource struct{ bus *worker.DeltaBus }

func (d deltaSource) FollowDeltas(key clog.Key) (transport.DeltaCursor, error) {
	return d.bus.FollowDeltas(key)
}
