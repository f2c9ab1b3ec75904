package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/convlog/convlog/transport/wire"
	"github.com/convlog/convlog/worker/natsbus"
)

// The cluster mode (-cluster): three nats-server processes as one cluster
// on loopback, one `convlog serve --workers=0` (the API and the log) and
// two `convlog worker` processes (the agents). Each cycle SIGKILLs one
// worker and the node that leads the submissions stream, and restarts
// both; the verification is the single-node one.

// clusterSize is the number of NATS nodes.
const clusterSize = 3

// clusterWorkers is the number of `convlog worker` processes.
const clusterWorkers = 2

type tortureCluster struct {
	names      []string // server names, "n1".."n3"
	urls       []string // client URLs
	confs      []string // config file paths
	nodes      []*tortureChild
	workerArgs []string
	workers    []*tortureChild
	nextWorker int // the one the next cycle kills
}

// clusterURL is every node's client URL, as a NATS client takes a cluster.
func (c *tortureCluster) clusterURL() string { return strings.Join(c.urls, ",") }

// setupCluster writes the nodes' configurations and the commands of the
// service and the workers.
func (t *torture) setupCluster() error {
	c := &tortureCluster{}
	var routes []string
	var clientPorts, routePorts []int
	for range clusterSize {
		cp, err := tortureFreePort()
		if err != nil {
			return err
		}
		rp, err := tortureFreePort()
		if err != nil {
			return err
		}
		clientPorts, routePorts = append(clientPorts, cp), append(routePorts, rp)
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", rp))
	}
	for i := range clusterSize {
		name := fmt.Sprintf("n%d", i+1)
		dir := filepath.Join(t.dir, "nats-"+name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// sync_interval: always fsyncs before every ack: what an operator
		// who needs an acked message to survive a machine's power loss
		// sets (docs/operations.md). A kill -9 does not need it, the page
		// cache survives a process; it is here so that the torture runs
		// the recommended broker settings.
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q
  sync_interval: always
}
cluster {
  name: torture
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, name, clientPorts[i], dir, routePorts[i], strings.Join(routes, ", "))
		path := filepath.Join(t.dir, "nats-"+name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return err
		}
		c.names = append(c.names, name)
		c.urls = append(c.urls, fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]))
		c.confs = append(c.confs, path)
	}
	c.nodes = make([]*tortureChild, clusterSize)
	c.workers = make([]*tortureChild, clusterWorkers)
	ttl := t.cfg.LeaseTTL.String()
	t.svcArgs = append(t.svcArgs, "--workers=0", "--nats", c.clusterURL(), "--nats-replicas", "3", "--lease-ttl", ttl)
	c.workerArgs = []string{"worker", "--nats", c.clusterURL(), "--nats-namespace", t.ns, "--nats-replicas", "3",
		"--lease-ttl", ttl, "--echo-delay", t.cfg.EchoDelay.String(), "--shutdown-timeout", "2s",
		"--sweep-interval", "1s", "--log-level", t.cfg.LogLevel}
	t.cluster = c
	t.natsURL = c.clusterURL()
	t.rep.Broker = fmt.Sprintf("cluster of %d nats-server nodes (R3, sync_interval always), serve --workers=0 and %d convlog workers; a worker and the submissions stream's leader SIGKILLed every cycle", clusterSize, clusterWorkers)
	return nil
}

func (t *torture) startNode(i int) error {
	c := t.cluster
	t.rep.BrokerStarts++
	n, err := startTortureChild("nats-"+c.names[i], t.brokerBin, []string{"-c", c.confs[i]}, filepath.Join(t.dir, "nats-"+c.names[i]+".log"))
	if err != nil {
		return err
	}
	c.nodes[i] = n
	return nil
}

func (t *torture) startWorker(i int) error {
	w, err := startTortureChild(fmt.Sprintf("worker-%d", i+1), t.cfg.Bin, t.cluster.workerArgs, filepath.Join(t.dir, fmt.Sprintf("worker-%d.log", i+1)))
	if err != nil {
		return err
	}
	t.cluster.workers[i] = w
	return nil
}

// startCluster starts the nodes together (a cluster's JetStream needs a
// quorum) and waits for each to answer JetStream requests.
func (t *torture) startCluster(ctx context.Context) error {
	for i := range clusterSize {
		if err := t.startNode(i); err != nil {
			return err
		}
	}
	for i := range clusterSize {
		if err := tortureWaitJetStream(ctx, t.cluster.nodes[i], t.cluster.urls[i], 90*time.Second); err != nil {
			return fmt.Errorf("cluster node %s: %w", t.cluster.names[i], err)
		}
	}
	return nil
}

func (t *torture) startWorkers() error {
	for i := range clusterWorkers {
		if err := t.startWorker(i); err != nil {
			return err
		}
	}
	return nil
}

// streamLeader names the node that leads the submissions stream, asking
// the nodes in turn (any may be down).
func (t *torture) streamLeader(ctx context.Context) (string, error) {
	var last error
	for i, u := range t.cluster.urls {
		if n := t.cluster.nodes[i]; n == nil || n.exited() {
			continue
		}
		leader, err := func() (string, error) {
			nc, err := nats.Connect(u, nats.Timeout(time.Second), nats.NoReconnect(), nats.Name("convlog-torture-probe"))
			if err != nil {
				return "", err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return "", err
			}
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			s, err := js.Stream(rctx, natsbus.Namespace(t.ns).StreamName())
			if err != nil {
				return "", err
			}
			info := s.CachedInfo()
			if info.Cluster == nil || info.Cluster.Leader == "" {
				return "", errors.New("no leader")
			}
			return info.Cluster.Leader, nil
		}()
		if err == nil {
			return leader, nil
		}
		last = err
	}
	return "", fmt.Errorf("submissions stream leader: %w", last)
}

// checkClusterChildren restarts a node or worker that exited by itself,
// counting it as an unexpected exit.
func (t *torture) checkClusterChildren() error {
	c := t.cluster
	for i, n := range c.nodes {
		if n != nil && n.exited() && !n.killed.Load() {
			t.rep.UnexpectedExits++
			t.rep.ExitNotes = append(t.rep.ExitNotes, n.describeExit())
			if err := t.startNode(i); err != nil {
				return err
			}
		}
	}
	for i, w := range c.workers {
		if w != nil && w.exited() && !w.killed.Load() {
			t.rep.UnexpectedExits++
			t.rep.ExitNotes = append(t.rep.ExitNotes, w.describeExit())
			if err := t.startWorker(i); err != nil {
				return err
			}
		}
	}
	return nil
}

// clusterKill is one cycle's kills: a worker and the stream's leading
// node, SIGKILLed together. It measures the stall they cause: until the
// stream has a leader again, and until a probe message posted at the
// kill is answered by an agent.
func (t *torture) clusterKill(ctx context.Context) error {
	c := t.cluster
	if err := t.checkClusterChildren(); err != nil {
		return err
	}
	leader, err := t.streamLeader(ctx)
	if err != nil {
		return err
	}
	li := -1
	for i, n := range c.names {
		if n == leader {
			li = i
		}
	}
	if li < 0 {
		return fmt.Errorf("torture: unknown stream leader %q", leader)
	}
	wi := c.nextWorker
	c.nextWorker = (c.nextWorker + 1) % clusterWorkers
	killedAt := time.Now()
	if err := c.workers[wi].kill(); err != nil {
		return err
	}
	if err := c.nodes[li].kill(); err != nil {
		return err
	}
	t.rep.BrokerKills++
	t.rep.WorkerKills++
	cycle := t.rep.Cycles + 1
	// The probe is admitted at once (the log is the admission) and
	// answered once the relay, the stream, the consumer and a worker are
	// all back.
	probe, err := t.postProbe(ctx, cycle)
	if err != nil {
		return err
	}
	if err := t.startWorker(wi); err != nil {
		return err
	}
	// The election: poll the surviving nodes until another leads.
	var elected time.Duration
	for {
		if l, err := t.streamLeader(ctx); err == nil && l != leader {
			elected = time.Since(killedAt)
			break
		}
		if time.Since(killedAt) > time.Minute {
			return fmt.Errorf("torture: no new stream leader within a minute of killing %s", leader)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
	if err := t.startNode(li); err != nil {
		return err
	}
	answered, outcome, err := t.awaitProbe(ctx, probe, killedAt)
	if err != nil {
		return err
	}
	if outcome != "completed" {
		t.rep.ProbeFailures++
	}
	note := fmt.Sprintf("cycle %d: killed worker-%d and leader %s: new leader in %s, probe answered (%s) %s after the kill",
		cycle, wi+1, leader, elected.Round(time.Millisecond), outcome, answered.Round(time.Millisecond))
	t.rep.Stalls = append(t.rep.Stalls, tortureStall{Election: elected, Answered: answered})
	t.logf("%s", note)
	// The restarted node rejoins before the next cycle may kill another.
	return tortureWaitJetStream(ctx, c.nodes[li], c.urls[li], 90*time.Second)
}

// postProbe posts the cycle's probe message to a session of its own.
func (t *torture) postProbe(ctx context.Context, cycle int) (string, error) {
	req := wire.DeliverRequest{Message: wire.Message{Kind: "user", Body: fmt.Sprintf("probe %d", cycle)}, Session: fmt.Sprintf("probe-%d", cycle)}
	for {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		acc, err := t.client.Deliver(actx, tortureAgent, t.instance, req, fmt.Sprintf("%s/probe-%d", t.instance, cycle))
		cancel()
		if err == nil {
			return acc.SubmissionID, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitProbe long-polls the probe until it is settled.
func (t *torture) awaitProbe(ctx context.Context, id string, since time.Time) (time.Duration, string, error) {
	for time.Since(since) < 2*time.Minute {
		s, err := t.client.Submission(ctx, tortureAgent, t.instance, id, 5*time.Second)
		if err == nil && s.Status.Terminal() {
			return time.Since(since), string(s.Status), nil
		}
		if ctx.Err() != nil {
			return 0, "", ctx.Err()
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return 0, "", fmt.Errorf("torture: probe %s not settled within 2 minutes", id)
}

// stopClusterWorkers stops the workers (SIGTERM) at the end, before the
// service.
func (t *torture) stopClusterWorkers() {
	for _, w := range t.cluster.workers {
		if w == nil || w.exited() {
			continue
		}
		if took, err := w.stop(20 * time.Second); err != nil {
			t.rep.FinalStopFailed++
			t.rep.sample("final stop of %s: %v after %s; last lines:\n%s", w.name, err, took.Round(time.Millisecond), tortureTail(w.logPath, 10))
		}
	}
}

// stopClusterNodes stops the NATS nodes at the end, after the service.
func (t *torture) stopClusterNodes() {
	for _, n := range t.cluster.nodes {
		if n != nil && !n.exited() {
			_, _ = n.stop(10 * time.Second)
		}
	}
}

// tortureStall is what one cycle's kills cost.
type tortureStall struct {
	Election time.Duration // until the stream had another leader
	Answered time.Duration // until a message posted at the kill was answered
}

// stallSummary is "min–max (mean)" of each measure.
func stallSummary(stalls []tortureStall) string {
	if len(stalls) == 0 {
		return ""
	}
	sum := func(get func(tortureStall) time.Duration) string {
		lo, hi, tot := get(stalls[0]), get(stalls[0]), time.Duration(0)
		for _, s := range stalls {
			d := get(s)
			lo, hi, tot = min(lo, d), max(hi, d), tot+d
		}
		return fmt.Sprintf("%s–%s (mean %s)", lo.Round(10*time.Millisecond), hi.Round(10*time.Millisecond), (tot / time.Duration(len(stalls))).Round(10*time.Millisecond))
	}
	return fmt.Sprintf("new stream leader after %s; a message posted at the kill answered after %s",
		sum(func(s tortureStall) time.Duration { return s.Election }),
		sum(func(s tortureStall) time.Duration { return s.Answered }))
}
