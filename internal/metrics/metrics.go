// Package metrics is convlog's Prometheus instrumentation. The engine, the
// workers and the HTTP server know nothing of Prometheus: each exposes a
// small observer interface (log.Observer, pool.Observer,
// transport.Observer) and a few state readers, and this package turns them
// into collectors on its own registry.
package metrics

import (
	"context"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

const namespace = "convlog"

// Metrics holds the collectors. It is a log.Observer, a pool.Observer
// and a transport.Observer.
type Metrics struct {
	reg *prometheus.Registry

	admissions   *prometheus.CounterVec
	commitWrites prometheus.Histogram
	commitTime   prometheus.Histogram
	syncTime     prometheus.Histogram
	turnTime     *prometheus.HistogramVec
	leaseLosses  prometheus.Counter
	refusals     *prometheus.CounterVec
}

// New makes the collectors, with the Go runtime's and the process's.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.admissions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "admissions_total",
		Help: "Deliveries by outcome: admitted, replayed (idempotent retry) or the error code they were refused with.",
	}, []string{"outcome"})
	m.commitWrites = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Name: "commit_writes",
		Help:    "Writes carried by one group commit of the log (one bbolt transaction, one fsync).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10), // 1 .. 512, the default cap
	})
	latency := prometheus.ExponentialBuckets(0.0001, 2, 16) // 100 µs .. 3.3 s
	m.commitTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Name: "commit_duration_seconds",
		Help: "Duration of one group commit, from the transaction's start to its fsync.", Buckets: latency,
	})
	m.syncTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Name: "commit_sync_duration_seconds",
		Help: "Part of a group commit spent writing its pages and fsyncing them.", Buckets: latency,
	})
	m.turnTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "turn_duration_seconds",
		Help:    "Duration of agent turns, from start to settlement, by agent and outcome.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14), // 1 ms .. 2.5 min
	}, []string{"agent", "outcome"})
	m.leaseLosses = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "lease_losses_total",
		Help: "Turns stopped because their session lease could not be renewed.",
	})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "access_refusals_total",
		Help: "Requests refused by access control, by code (unauthorized, forbidden, rate_limited) and, for rate_limited, the principal's limit hit (deliveries, streams).",
	}, []string{"code", "limit"})
	m.reg.MustRegister(m.admissions, m.commitWrites, m.commitTime, m.syncTime, m.turnTime, m.leaseLosses, m.refusals,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is where the collectors are, for a caller adding its own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the exposition (text format, or what the scraper asks).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Admission implements transport.Observer.
func (m *Metrics) Admission(outcome string) { m.admissions.WithLabelValues(outcome).Inc() }

// Committed implements log.Observer.
func (m *Metrics) Committed(writes int, total, sync time.Duration) {
	m.commitWrites.Observe(float64(writes))
	m.commitTime.Observe(total.Seconds())
	m.syncTime.Observe(sync.Seconds())
}

// TurnEnded implements pool.Observer.
func (m *Metrics) TurnEnded(agent string, outcome record.Outcome, d time.Duration) {
	m.turnTime.WithLabelValues(agent, string(outcome)).Observe(d.Seconds())
}

// LeaseLost implements pool.Observer.
func (m *Metrics) LeaseLost() { m.leaseLosses.Inc() }

// AccessRefused counts a request refused by access control.
func (m *Metrics) AccessRefused(code, limit string) { m.refusals.WithLabelValues(code, limit).Inc() }

// State reads what is measured at scrape time. Any field may be nil.
type State struct {
	Backlog      func(ctx context.Context) (clog.Backlog, error) // log.DB.Backlog
	Running      func() (turns, submissions int)                 // pool.Pool.Running
	Streams      func() int64                                    // transport.Server.OpenStreams
	StreamWrites func() (writes, bytes uint64)                   // transport.Server.StreamWrites
	NATS         *nats.Conn
}

// Watch registers the scrape-time gauges of st.
func (m *Metrics) Watch(st State) { m.reg.MustRegister(&stateCollector{st: st}) }

var (
	descOutbox = prometheus.NewDesc(namespace+"_outbox_backlog",
		"Admitted submissions not yet published to the broker.", nil, nil)
	descUnsettled = prometheus.NewDesc(namespace+"_submissions_unsettled",
		"Submissions admitted or running, in the whole log.", nil, nil)
	descRunning = prometheus.NewDesc(namespace+"_turns_running",
		"Turns this node is running.", nil, nil)
	descQueued = prometheus.NewDesc(namespace+"_submissions_queued",
		"Unsettled submissions not answered by a turn running on this node: waiting for a turn (or running on another node).", nil, nil)
	descStreams = prometheus.NewDesc(namespace+"_streams_open",
		"Open SSE streams.", nil, nil)
	descStreamWrites = prometheus.NewDesc(namespace+"_stream_writes_total",
		"Socket writes of the SSE streams: a write carries every frame a stream had ready, so writes against frames shows how well their coalescing works.", nil, nil)
	descStreamBytes = prometheus.NewDesc(namespace+"_stream_bytes_total",
		"Bytes the SSE streams wrote to their sockets.", nil, nil)
	descNATS = prometheus.NewDesc(namespace+"_nats_connected",
		"1 while the connection to NATS is up, else 0.", nil, nil)
	descReconnects = prometheus.NewDesc(namespace+"_nats_reconnects_total",
		"Times the NATS connection was re-established.", nil, nil)
)

type stateCollector struct{ st State }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutbox, descUnsettled, descRunning, descQueued, descStreams, descStreamWrites, descStreamBytes, descNATS, descReconnects} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	unsettled := -1
	if c.st.Backlog != nil {
		// A scrape must not hang on the log: it answers from one short
		// read transaction, or not at all once the log is closed.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		b, err := c.st.Backlog(ctx)
		cancel()
		if err == nil {
			unsettled = b.Unsettled
			ch <- prometheus.MustNewConstMetric(descOutbox, prometheus.GaugeValue, float64(b.Outbox))
			ch <- prometheus.MustNewConstMetric(descUnsettled, prometheus.GaugeValue, float64(b.Unsettled))
		}
	}
	if c.st.Running != nil {
		turns, subs := c.st.Running()
		ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(turns))
		if unsettled >= 0 {
			ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(max(unsettled-subs, 0)))
		}
	}
	if c.st.Streams != nil {
		ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(c.st.Streams()))
	}
	if c.st.StreamWrites != nil {
		writes, bytes := c.st.StreamWrites()
		ch <- prometheus.MustNewConstMetric(descStreamWrites, prometheus.CounterValue, float64(writes))
		ch <- prometheus.MustNewConstMetric(descStreamBytes, prometheus.CounterValue, float64(bytes))
	}
	if nc := c.st.NATS; nc != nil {
		up := 0.0
		if nc.IsConnected() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descNATS, prometheus.GaugeValue, up)
		ch <- prometheus.MustNewConstMetric(descReconnects, prometheus.CounterValue, float64(nc.Stats().Reconnects))
	}
}
