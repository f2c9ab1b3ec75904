package main

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// writeChart writes the offered-load sweep as latency.csv and latency.png
// (p50 and p99 against offered load, one colour per system, log scale).
func (r *benchReport) writeChart(dir string) error {
	r.mu.Lock()
	points := slices.Clone(r.load)
	r.mu.Unlock()
	if len(points) == 0 {
		return nil
	}
	f, err := os.Create(filepath.Join(dir, "latency.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"system", "offered_rps", "achieved_rps", "p50_ms", "p99_ms", "max_ms", "dropped", "errors"})
	for _, p := range points {
		_ = w.Write([]string{p.system, fmt.Sprint(p.offered), fmt.Sprintf("%.0f", p.achieved),
			fmt.Sprintf("%.3f", p.p50.Seconds()*1000), fmt.Sprintf("%.3f", p.p99.Seconds()*1000), fmt.Sprintf("%.3f", p.max.Seconds()*1000),
			fmt.Sprint(p.dropped), fmt.Sprint(p.errs)})
	}
	w.Flush()
	if err := benchFirstErr(w.Error(), f.Close()); err != nil {
		return err
	}

	p := plot.New()
	p.Title.Text = "Durable admission: latency against offered load (open loop, 2 cores)"
	p.X.Label.Text = "offered load (POST/s)"
	p.Y.Label.Text = "latency (ms, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.Padding = vg.Points(2)
	p.Add(plotter.NewGrid())
	colors := map[string]color.Color{
		"convlog":                    color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		benchSystemLabel("postgres"): color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		benchSystemLabel("redis"):    color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	}
	var systems []string
	for _, pt := range points {
		if !slices.Contains(systems, pt.system) {
			systems = append(systems, pt.system)
		}
	}
	for _, sys := range systems {
		var p50, p99 plotter.XYs
		for _, pt := range points {
			if pt.system != sys || pt.p50 <= 0 {
				continue
			}
			p50 = append(p50, plotter.XY{X: float64(pt.offered), Y: pt.p50.Seconds() * 1000})
			p99 = append(p99, plotter.XY{X: float64(pt.offered), Y: max(pt.p99.Seconds()*1000, 1e-3)})
		}
		c := colors[sys]
		if c == nil {
			c = color.Black
		}
		for i, series := range []plotter.XYs{p50, p99} {
			if len(series) == 0 {
				continue
			}
			l, s, err := plotter.NewLinePoints(series)
			if err != nil {
				return err
			}
			l.Color, s.Color = c, c
			l.Width = vg.Points(1.5)
			name := sys + " p50"
			if i == 1 {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				s.Shape = draw.TriangleGlyph{}
				name = sys + " p99"
			} else {
				s.Shape = draw.CircleGlyph{}
			}
			p.Add(l, s)
			p.Legend.Add(name, l, s)
		}
	}
	// Room above the curves for the legend (log scale: a factor).
	lo, hi := math.Inf(1), 0.0
	for _, pt := range points {
		if pt.p50 > 0 {
			lo = min(lo, pt.p50.Seconds()*1000)
			hi = max(hi, pt.p99.Seconds()*1000)
		}
	}
	if hi > 0 {
		p.Y.Min, p.Y.Max = lo/2, hi*40
	}
	return p.Save(9*vg.Inch, 6*vg.Inch, filepath.Join(dir, "latency.png"))
}

func benchFirstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
