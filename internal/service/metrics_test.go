package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/convlog/convlog/internal/auth"
	"github.com/convlog/convlog/internal/servicetest"
	"github.com/convlog/convlog/transport/client"
	"github.com/convlog/convlog/transport/wire"
)

// scrape reads /metrics as Prometheus would, in the text format.
func scrape(t testing.TB, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not the text format: %v", err)
	}
	return fams
}

// metricValue sums the family's samples whose labels include want: a
// counter's or gauge's value, a histogram's count.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	var sum float64
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

func TestMetricsScrape(t *testing.T) {
	svc, c := testService(t, nil)
	before := scrape(t, svc.Addr())
	types := map[string]dto.MetricType{
		"convlog_admissions_total":             dto.MetricType_COUNTER,
		"convlog_commit_writes":                dto.MetricType_HISTOGRAM,
		"convlog_commit_duration_seconds":      dto.MetricType_HISTOGRAM,
		"convlog_commit_sync_duration_seconds": dto.MetricType_HISTOGRAM,
		"convlog_turn_duration_seconds":        dto.MetricType_HISTOGRAM,
		"convlog_lease_losses_total":           dto.MetricType_COUNTER,
		"convlog_outbox_backlog":               dto.MetricType_GAUGE,
		"convlog_submissions_unsettled":        dto.MetricType_GAUGE,
		"convlog_submissions_queued":           dto.MetricType_GAUGE,
		"convlog_turns_running":                dto.MetricType_GAUGE,
		"convlog_streams_open":                 dto.MetricType_GAUGE,
		"convlog_stream_writes_total":          dto.MetricType_COUNTER,
		"convlog_stream_bytes_total":           dto.MetricType_COUNTER,
		"convlog_nats_connected":               dto.MetricType_GAUGE,
		"convlog_nats_reconnects_total":        dto.MetricType_COUNTER,
		"go_goroutines":                        dto.MetricType_GAUGE,
	}
	// Vectors appear once they have a child: make one of each.
	acc := servicetest.Deliver(t, c, "echo", "m1", "", "count me")
	servicetest.ReadUntilSettled(t, c, "echo", "m1", "default", acc.Offset, acc.SubmissionID)
	if _, err := c.Deliver(context.Background(), "nobody", "m1", wire.DeliverRequest{Message: wire.Message{Body: "x"}}, ""); !client.IsCode(err, wire.CodeNotFound) {
		t.Fatalf("delivery to an unknown agent: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sr, err := c.Stream(ctx, "echo", "m1", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Close()
	if _, err := sr.Next(); err != nil {
		t.Fatal(err)
	}

	after := scrape(t, svc.Addr())
	for name, typ := range types {
		f := after[name]
		if f == nil {
			t.Errorf("no %s", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s is a %v, want %v", name, f.GetType(), typ)
		}
		if f.GetHelp() == "" {
			t.Errorf("%s has no help", name)
		}
	}
	moved := []struct {
		name   string
		labels map[string]string
	}{
		{"convlog_admissions_total", map[string]string{"outcome": "admitted"}},
		{"convlog_admissions_total", map[string]string{"outcome": "not_found"}},
		{"convlog_commit_writes", nil},
		{"convlog_commit_duration_seconds", nil},
		{"convlog_turn_duration_seconds", map[string]string{"agent": "echo", "outcome": "completed"}},
		{"convlog_stream_writes_total", nil}, // the stream's first frame
		{"convlog_stream_bytes_total", nil},
	}
	// Counted after the answer is on its way (an admission's outcome once
	// the handler returns, a turn's duration after its settlement
	// commits): a scrape right after may come first, so poll.
	var why string
	defer func() {
		if t.Failed() {
			t.Log(why)
		}
	}()
	eventually(t, "the metrics move", func() bool {
		after := scrape(t, svc.Addr())
		why = ""
		for _, m := range moved {
			b, a := max(metricValue(before, m.name, m.labels), 0), metricValue(after, m.name, m.labels)
			if a <= b {
				why += fmt.Sprintf("%s%v did not move: %v then %v; ", m.name, m.labels, b, a)
			}
		}
		if v := metricValue(after, "convlog_streams_open", nil); v < 1 {
			why += fmt.Sprintf("streams open = %v with one open; ", v)
		}
		if v := metricValue(after, "convlog_nats_connected", nil); v != 1 {
			why += fmt.Sprintf("nats connected = %v; ", v)
		}
		if v := metricValue(after, "convlog_submissions_unsettled", nil); v != 0 {
			why += fmt.Sprintf("unsettled = %v after the turn settled; ", v)
		}
		return why == ""
	})
}

// Access control's refusals and the principals' limits are in /metrics
// (scraped with an admin token: with access control on, metrics are admin).
func TestMetricsCountAccessRefusals(t *testing.T) {
	tokens := map[string][]string{"ops": {"admin"}, "alice": {"deliver:echo/*"}}
	var cfg auth.Config
	for tok, scopes := range tokens {
		sum := sha256.Sum256([]byte(tok))
		cfg.Tokens = append(cfg.Tokens, auth.TokenConfig{SHA256: hex.EncodeToString(sum[:]), Principal: tok, Scopes: scopes})
	}
	cfg.Limits = auth.Limits{DeliveriesPerSecond: 0.001, Burst: 1}
	svc, _ := testService(t, func(c *Config) { c.Auth = &cfg })
	post := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+svc.Addr()+"/agents/echo/i", strings.NewReader(`{"message":"hi"}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, want := range []struct {
		token  string
		status int
	}{{"", 401}, {"ops", 403}, {"alice", 202}, {"alice", 429}} {
		if got := post(want.token); got != want.status {
			t.Fatalf("POST as %q: %d, want %d", want.token, got, want.status)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+svc.Addr()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer ops")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"code": "unauthorized"}, 1},
		{map[string]string{"code": "forbidden"}, 1},
		{map[string]string{"code": "rate_limited", "limit": "deliveries"}, 1},
	} {
		if got := metricValue(fams, "convlog_access_refusals_total", c.labels); got != c.want {
			t.Errorf("convlog_access_refusals_total%v = %v, want %v", c.labels, got, c.want)
		}
	}
}
