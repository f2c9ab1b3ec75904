package replproto

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/convlog/convlog/internal/boltceiling"
	"github.com/convlog/convlog/internal/check"
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, s := range shared.servers {
		s.Shutdown()
		s.WaitForShutdown()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// shared is the one cluster of the package's tests and benchmarks (a
// benchmark function runs several times; a cluster per run would be most
// of its cost).
var shared struct {
	once    sync.Once
	url     string
	err     error
	dir     string
	servers []*server.Server
}

func cluster(tb testing.TB) string {
	tb.Helper()
	shared.once.Do(func() { shared.url, shared.err = startCluster() })
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.url
}

// startCluster starts 3 NATS servers in this process as one cluster on
// loopback, fsyncing before every ack (sync_interval: always).
func startCluster() (string, error) {
	dir, err := os.MkdirTemp("", "replproto-")
	if err != nil {
		return "", err
	}
	shared.dir = dir
	ports := make([]int, 3)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	for i := range ports {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: filepath.Join(dir, fmt.Sprint(i)), SyncAlways: true,
			NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "proto", Host: "127.0.0.1", Port: ports[i]},
			Routes:  routes,
		}
		s, err := server.NewServer(opts)
		if err != nil {
			return "", err
		}
		go s.Start()
		shared.servers = append(shared.servers, s)
	}
	for _, s := range shared.servers {
		if !s.ReadyForConnections(30 * time.Second) {
			return "", errors.New("server not ready")
		}
	}
	return shared.servers[0].ClientURL(), nil
}

func connect(tb testing.TB, u string) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(u)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

func partition(tb testing.TB, nc *nats.Conn, name string) *Owner {
	tb.Helper()
	var o *Owner
	var err error
	check.For(tb, time.Minute, 100*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		o, err = Partition(ctx, nc, name, 3)
		return err
	})
	return o
}

// An owner that did not apply the partition's last write is refused by
// NATS: two owners of one partition cannot both write.
func TestStaleOwnerRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster; skipped with -short")
	}
	nc := connect(t, cluster(t))
	a := partition(t, nc, "P0")
	b := partition(t, nc, "P0") // a second owner, from the same start
	ctx := context.Background()
	if err := a.Append(ctx, []byte("by a")); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(ctx, []byte("by b")); !errors.Is(err, ErrStaleOwner) {
		t.Fatalf("stale owner's append: %v, want ErrStaleOwner", err)
	}
	if err := a.Append(ctx, []byte("by a again")); err != nil {
		t.Fatalf("current owner after the refusal: %v", err)
	}
}

// BenchmarkReplicatedAppend: concurrent writers each append 256-byte
// records and wait for each to be acked by the R3 stream (fsync before
// ack), batched by the owner into conditional publishes. Reported as
// records/s; with one batch in flight, throughput is writers / latency.
func BenchmarkReplicatedAppend(b *testing.B) {
	for _, writers := range []int{64, 512} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			nc := connect(b, cluster(b))
			o := partition(b, nc, fmt.Sprintf("BENCH%d", writers))
			rec := make([]byte, 256)
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			per := b.N/writers + 1
			for range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						if err := o.Append(ctx, rec); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(per*writers)/time.Since(start).Seconds(), "records/s")
		})
	}
}

// BenchmarkBoltCeiling is the bare-bbolt group commit (fsync per commit)
// under the same writers and record size, run beside the replicated path
// so that their ratio is taken under the same noise.
func BenchmarkBoltCeiling(b *testing.B) {
	for _, writers := range []int{64, 512} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			db, err := boltceiling.Open(filepath.Join(b.TempDir(), "bare.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			gc := boltceiling.New(db)
			defer gc.Close()
			rec := make([]byte, 256)
			var n atomic.Uint64
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			per := b.N/writers + 1
			for range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						k := make([]byte, 8)
						binary.BigEndian.PutUint64(k, n.Add(1))
						if err := gc.Put(k, rec); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(per*writers)/time.Since(start).Seconds(), "records/s")
		})
	}
}
