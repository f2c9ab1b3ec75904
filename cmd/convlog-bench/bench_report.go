package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// benchRow is one line of the results table.
type benchRow struct {
	section  string // "1. Admission"
	workload string
	system   string
	lat      *benchLatency
	rate     float64
	unit     string
	other    string
}

// benchLoadPoint is one step of the offered-load sweep.
type benchLoadPoint struct {
	system   string
	offered  int
	achieved float64
	p50, p99 time.Duration
	max      time.Duration
	dropped  int
	errs     int
}

type benchReport struct {
	mu       sync.Mutex
	rows     []benchRow
	vals     map[string]float64
	load     []benchLoadPoint
	machine  []string
	failures []string
	notes    []string
	elapsed  time.Duration
}

func newBenchReport() *benchReport { return &benchReport{vals: map[string]float64{}} }

func (r *benchReport) add(row benchRow) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, row)
}

func (r *benchReport) set(key string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.vals[key] = v
}

func (r *benchReport) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// unavailable records a system that could not be measured.
func (r *benchReport) unavailable(section, workload, system string, err error) {
	r.add(benchRow{section: section, workload: workload, system: system, other: "unavailable: " + benchOneLine(err.Error())})
}

func benchOneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return strings.ReplaceAll(s, "|", "/")
}

// latVals records a latency summary under key (seconds) and returns it for
// a row.
func (r *benchReport) latVals(key string, l benchLatency) *benchLatency {
	r.set(key+".p50", l.p50.Seconds())
	r.set(key+".p99", l.p99.Seconds())
	r.set(key+".max", l.max.Seconds())
	return &l
}

func fmtCount(f float64) string {
	n := int64(f + 0.5)
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

const (
	benchDocBegin = "<!-- BEGIN GENERATED: convlog bench (do not edit by hand; rerun `make bench`) -->"
	benchDocEnd   = "<!-- END GENERATED: convlog bench -->"
)

// markdown renders the run: machine, table, ratios, targets.
func (r *benchReport) markdown(e *benchEnv) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	mode := "full run"
	if e.opts.quick {
		mode = "**-quick smoke run: sizes are not the issue's; do not quote these numbers**"
	}
	fmt.Fprintf(&b, "### Run of %s (%s, %.1f minutes)\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), mode, r.elapsed.Minutes())
	fmt.Fprintf(&b, "Command: `%s`\n\n", strings.TrimSpace(e.opts.commands))
	for _, m := range r.machine {
		fmt.Fprintf(&b, "- %s\n", m)
	}
	if l, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "- Load average at the end: %s (other work on the machine shares the 2 cores: quote ratios, not absolute figures)\n", strings.Join(strings.Fields(string(l))[:3], " "))
	}
	b.WriteString("\n| # | workload | system | p50 | p99 | max | throughput | other |\n|---|---|---|---|---|---|---|---|\n")
	last := ""
	for _, row := range r.rows {
		sec := row.section
		if sec == last {
			sec = ""
		} else {
			last = sec
		}
		p50, p99, mx := "", "", ""
		if row.lat != nil && row.lat.n > 0 {
			p50, p99, mx = fmtMS(row.lat.p50), fmtMS(row.lat.p99), fmtMS(row.lat.max)
		}
		tp := ""
		if row.rate > 0 {
			tp = fmtCount(row.rate) + " " + row.unit
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", sec, row.workload, row.system, p50, p99, mx, tp, row.other)
	}
	if len(r.load) > 0 {
		b.WriteString("\nOffered load (open loop, latency counted from each request's scheduled time; 256 B POSTs to 256 sessions):\n\n")
		b.WriteString("| system | offered req/s | achieved req/s | p50 | p99 | max | dropped (over 1,024 in flight) | errors |\n|---|---|---|---|---|---|---|---|\n")
		for _, p := range r.load {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %d | %d |\n", p.system, fmtCount(float64(p.offered)), fmtCount(p.achieved), fmtMS(p.p50), fmtMS(p.p99), fmtMS(p.max), p.dropped, p.errs)
		}
		if e.opts.out != "" && e.opts.doc != "" {
			rel, err := filepath.Rel(filepath.Dir(e.opts.doc), filepath.Join(e.opts.out, "latency.png"))
			if err == nil {
				fmt.Fprintf(&b, "\n![p50 and p99 admission latency against offered load](%s)\n", filepath.ToSlash(rel))
			}
		}
	}
	b.WriteString("\n#### Ratios (same run, same machine)\n\n")
	for _, line := range r.ratios() {
		fmt.Fprintf(&b, "- %s\n", line)
	}
	b.WriteString("\n#### Targets\n\n| target | measured | met |\n|---|---|---|\n")
	for _, t := range r.targets(e) {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t[0], t[1], t[2])
	}
	if len(r.notes) > 0 {
		b.WriteString("\n#### Notes of this run\n\n")
		for _, n := range r.notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	if len(r.failures) > 0 {
		b.WriteString("\n#### Failures\n\n")
		for _, f := range r.failures {
			fmt.Fprintf(&b, "- %s\n", benchOneLine(f))
		}
	}
	return b.String()
}

func (r *benchReport) v(key string) (float64, bool) { v, ok := r.vals[key]; return v, ok }

func (r *benchReport) ratios() []string {
	var out []string
	ratio := func(label, num, den, unit string) {
		a, ok1 := r.v(num)
		c, ok2 := r.v(den)
		if !ok1 || !ok2 || c == 0 {
			return
		}
		out = append(out, fmt.Sprintf("%s: **%.2f×** (%s / %s %s)", label, a/c, fmtCount(a), fmtCount(c), unit))
	}
	latRatio := func(label, num, den string) {
		a, ok1 := r.v(num)
		c, ok2 := r.v(den)
		if !ok1 || !ok2 || c == 0 {
			return
		}
		out = append(out, fmt.Sprintf("%s: **%.2f×** (%s / %s)", label, a/c, fmtMS(time.Duration(a*1e9)), fmtMS(time.Duration(c*1e9))))
	}
	if q, ok := r.v("adm.ratio.bbolt"); ok {
		a, _ := r.v("adm.convlog.rate")
		c, _ := r.v("adm.bbolt.rate")
		out = append(out, fmt.Sprintf("convlog durable admission / bare bbolt group-commit ceiling: **%.0f%%** (median of the per-round ratios; medians %s POST/s and %s puts/s; target ≥ 60%%)", 100*q, fmtCount(a), fmtCount(c)))
	}
	ratio("convlog admission / JetStream publish-with-ack (default sync, not fsynced per ack)", "adm.convlog.rate", "ceiling.js", "/s")
	ratio("convlog admission / JetStream publish-with-ack (sync_always, fsync per ack)", "adm.convlog.rate", "ceiling.jssync", "/s")
	ratio("convlog admission / PostgreSQL baseline admission (POST/s)", "adm.convlog.rate", "adm.postgres.rate", "POST/s")
	latRatio("convlog admission p99 / PostgreSQL p99 (lower is better)", "adm.convlog.p99", "adm.postgres.p99")
	ratio("convlog admission / Redis baseline admission (POST/s; Redis keeps nothing on disk)", "adm.convlog.rate", "adm.redis.rate", "POST/s")
	ratio("convlog / PostgreSQL catch-up over SSE (records/s)", "catch.convlog.sse.rps", "catch.postgres.sse.rps", "records/s")
	ratio("convlog / PostgreSQL catch-up over JSON polling (records/s)", "catch.convlog.json.rps", "catch.postgres.json.rps", "records/s")
	ratio("convlog / Redis catch-up over SSE (records/s)", "catch.convlog.sse.rps", "catch.redis.sse.rps", "records/s")
	for _, n := range []string{"1000", "50"} {
		latRatio("convlog / PostgreSQL fan-out delivery p99 at "+n+" readers (lower is better)", "fan.convlog."+n+".p99", "fan.postgres."+n+".p99")
		latRatio("convlog / Redis fan-out delivery p99 at "+n+" readers (lower is better)", "fan.convlog."+n+".p99", "fan.redis."+n+".p99")
	}
	if first, last, ok := r.sessionSpan("convlog"); ok {
		latRatio(fmt.Sprintf("convlog random-read p50 at %s sessions / at %s sessions (flat is 1.0)", last, first), "sess.convlog."+last+".p50", "sess.convlog."+first+".p50")
		latRatio(fmt.Sprintf("convlog / PostgreSQL random-read p50 at %s sessions (lower is better)", last), "sess.convlog."+last+".p50", "sess.postgres."+last+".p50")
	}
	return out
}

// sessionSpan is the smallest and largest session checkpoints measured.
func (r *benchReport) sessionSpan(sys string) (string, string, bool) {
	var ns []int
	for k := range r.vals {
		var n int
		if _, err := fmt.Sscanf(k, "sess."+sys+".%d.p50", &n); err == nil {
			ns = append(ns, n)
		}
	}
	if len(ns) < 2 {
		return "", "", false
	}
	lo, hi := ns[0], ns[0]
	for _, n := range ns {
		lo, hi = min(lo, n), max(hi, n)
	}
	return fmt.Sprint(lo), fmt.Sprint(hi), true
}

func benchYesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// targets evaluates the targets against this run.
func (r *benchReport) targets(e *benchEnv) [][3]string {
	var t [][3]string
	if q, ok := r.v("adm.ratio.bbolt"); ok {
		a, _ := r.v("adm.convlog.rate")
		c, _ := r.v("adm.bbolt.rate")
		t = append(t, [3]string{"durable admission ≥ 60% of the bbolt group-commit ceiling", fmt.Sprintf("%.0f%% (%s POST/s against %s puts/s)", 100*q, fmtCount(a), fmtCount(c)), benchYesNo(q >= 0.6)})
	}
	if p, ok := r.v("adm.convlog.p99"); ok {
		t = append(t, [3]string{"admission p99 < 15 ms (64 clients)", fmtMS(time.Duration(p * 1e9)), benchYesNo(p < 0.015)})
	}
	if p, ok := r.v("e2e.delta.p50"); ok {
		t = append(t, [3]string{"POST to first delta p50 < 2 ms", fmtMS(time.Duration(p * 1e9)), benchYesNo(p < 0.002)})
	}
	n := fmt.Sprint(e.sz.fanout[len(e.sz.fanout)-1])
	if p, ok := r.v("fan.convlog." + n + ".p99"); ok {
		t = append(t, [3]string{n + " SSE readers: delivery p99 < 100 ms", fmtMS(time.Duration(p * 1e9)), benchYesNo(p < 0.1)})
	}
	if p, ok := r.v("fan.convlog." + n + ".p99"); ok {
		if f, ok := r.v("fan.floor." + n + ".p99"); ok && f > 0 {
			t = append(t, [3]string{n + " SSE readers: delivery p99 ≤ 1.5× the do-nothing floor's (same run)",
				fmt.Sprintf("%.1f× (%s against %s)", p/f, fmtMS(time.Duration(p*1e9)), fmtMS(time.Duration(f*1e9))), benchYesNo(p <= 1.5*f)})
		}
	}
	if k, ok := r.v("fan.convlog." + n + ".kib"); ok {
		t = append(t, [3]string{n + " SSE readers: < 32 KiB resident per reader", fmt.Sprintf("%.1f KiB", k), benchYesNo(k < 32)})
	}
	if best, ok := r.openLoopBest("convlog"); ok {
		t = append(t, [3]string{"open loop: p99 < 50 ms up to ≥ 5,000 offered POST/s", fmt.Sprintf("up to %s POST/s", fmtCount(float64(best))), benchYesNo(best >= 5000)})
	}
	if k, ok := r.v("fan.idle.kib"); ok {
		n, _ := r.v("fan.idle.readers")
		p, _ := r.v("fan.idle.p99")
		why := "the descriptor limit"
		if e.opts.quick {
			why = "quick sizes"
		}
		t = append(t, [3]string{"100,000 idle SSE readers on one process: memory per reader, hot conversation's p99",
			fmt.Sprintf("%s readers (%s), %.1f KiB/reader, p99 %s", fmtCount(n), why, k, fmtMS(time.Duration(p*1e9))), benchYesNo(n >= idleTarget)})
	}
	if v, ok := r.v("catch.convlog.sse.rps"); ok {
		t = append(t, [3]string{"catch-up over SSE ≥ 200,000 records/s", fmtCount(v) + " records/s", benchYesNo(v >= 200_000)})
	}
	// No row worse than PostgreSQL.
	type cmp struct {
		label, key string
		higher     bool
	}
	cmps := []cmp{
		{"admission POST/s", "adm.%s.rate", true},
		{"admission p99", "adm.%s.p99", false},
		{"catch-up SSE records/s", "catch.%s.sse.rps", true},
		{"catch-up JSON records/s", "catch.%s.json.rps", true},
	}
	for _, n := range e.sz.fanoutBaseline {
		cmps = append(cmps, cmp{fmt.Sprintf("fan-out %d readers delivery p99", n), fmt.Sprintf("fan.%%s.%d.p99", n), false})
	}
	if _, last, ok := r.sessionSpan("convlog"); ok {
		cmps = append(cmps, cmp{"random read p99 at " + last + " sessions", "sess.%s." + last + ".p99", false})
	}
	var worse, compared []string
	for _, c := range cmps {
		a, ok1 := r.v(fmt.Sprintf(c.key, "convlog"))
		p, ok2 := r.v(fmt.Sprintf(c.key, "postgres"))
		if !ok1 || !ok2 {
			continue
		}
		compared = append(compared, c.label)
		if (c.higher && a < p) || (!c.higher && a > p) {
			worse = append(worse, c.label)
		}
	}
	if len(compared) > 0 {
		m := fmt.Sprintf("%d rows compared", len(compared))
		if len(worse) > 0 {
			m += "; worse: " + strings.Join(worse, ", ")
		}
		t = append(t, [3]string{"no row worse than the PostgreSQL baseline", m, benchYesNo(len(worse) == 0)})
	}
	return t
}

// openLoopBest is the highest offered rate of the sweep below which every
// step of sys kept its p99 under 50 ms. The caller holds r.mu (markdown).
func (r *benchReport) openLoopBest(sys string) (int, bool) {
	best, any := 0, false
	for _, p := range r.load {
		if p.system != benchSystemLabel(sys) {
			continue
		}
		any = true
		if p.p99 >= 50*time.Millisecond || p.dropped > 0 || p.errs > 0 {
			break
		}
		best = p.offered
	}
	return best, any
}

// describeMachine: cores, CPU model, memory, kernel, Go, the baselines'
// versions.
func benchDescribeMachine(ctx context.Context, o benchOptions) []string {
	model := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = "; load average at start " + strings.Join(strings.Fields(string(b))[:3], " ")
	}
	lines := []string{
		fmt.Sprintf("Machine: %d cores (`nproc`), %s, %s memory, Linux %s, %s; one shared disk; load generator and service on the same 2 cores%s", runtime.NumCPU(), model, mem, kernel, runtime.Version(), load),
	}
	if out, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		code := "Code: commit " + strings.TrimSpace(string(out))
		if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
			code += fmt.Sprintf(" plus uncommitted changes to %d files", len(bytes.Split(bytes.TrimSpace(st), []byte("\n"))))
		}
		lines = append(lines, code+" (the working tree the binary was built from, if run from it)")
	}
	if o.baselines {
		lines = append(lines, "PostgreSQL: "+benchPGVersion(ctx, o.pgDSN), "Redis: "+benchRedisVersion(ctx, o.redisAddr))
	}
	return lines
}

// benchSpliceDoc replaces the generated section of the markdown file at path
// (between benchDocBegin and benchDocEnd) with md, creating the file or the section
// if needed, and keeps everything written by hand around it.
func benchSpliceDoc(path, md string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	section := benchDocBegin + "\n\n" + md + "\n" + benchDocEnd
	s := string(old)
	i, j := strings.Index(s, benchDocBegin), strings.Index(s, benchDocEnd)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + section + s[j+len(benchDocEnd):]
	case len(s) == 0:
		s = "# Benchmarks\n\n" + section + "\n"
	default:
		s = strings.TrimRight(s, "\n") + "\n\n" + section + "\n"
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(s), 0o644)
}
