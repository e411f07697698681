package chaos

import (
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"time"
)

// faultColors are the bar colors of each fault kind in the picture.
var faultColors = map[string]string{
	faultKill: "#d62728", faultPause: "#9467bd", faultPartition: "#1f77b4", faultHalves: "#17becf",
	faultBridge: "#2ca02c", faultOneWay: "#8c564b", faultLoss: "#bcbd22", faultSlow: "#7f7f7f",
	faultDisk: "#e377c2", faultLeave: "#ff7f0e", faultJoin: "#98df8a", faultClientKill: "#c5b0d5",
}

// picture draws the run: the faults on a time line, and for every node the
// latency of its operations (the slowest of each quarter second), the
// operations that failed, those that never returned, and the violations.
func picture(w io.Writer, title string, ops []*Op, faults []Fault, events []event, vs []Violation, nodes int, t0, tEnd int64, deadline time.Duration) error {
	const (
		width, left, right = 1200, 80, 20
		faultH, panelH     = 46, 120
		bucket             = int64(250 * time.Millisecond)
	)
	if tEnd <= t0 {
		tEnd = t0 + 1
	}
	height := 40 + faultH + nodes*(panelH+16) + 50
	x := func(t int64) float64 {
		return left + float64(t-t0)/float64(tEnd-t0)*float64(width-left-right)
	}
	// Latency axis: 50 µs to the longest wait (at least twice the deadline), log.
	maxLat := 2 * float64(deadline)
	for _, o := range ops {
		if o.Return != 0 && float64(o.Return-o.Call) > maxLat {
			maxLat = float64(o.Return - o.Call)
		}
	}
	lo, hi := math.Log10(50e3), math.Log10(maxLat*1.1)
	p := &svgWriter{w: w}
	p.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	p.f(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p.f(`<text x="%d" y="18" font-size="14">%s</text>`+"\n", left, html.EscapeString(title))
	top := 30.0
	// The time axis, every 5 s.
	for s := int64(0); t0+s*int64(time.Second) <= tEnd; s += 5 {
		tx := x(t0 + s*int64(time.Second))
		p.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", tx, top, tx, height-40)
		p.f(`<text x="%.1f" y="%d" text-anchor="middle" fill="#666">%ds</text>`+"\n", tx, height-28, s)
	}
	// Faults, on two alternating lanes so that labels do not collide.
	p.f(`<text x="4" y="%.1f">faults</text>`+"\n", top+24)
	for i, f := range faults {
		if f.Start == 0 {
			continue
		}
		end := f.End
		if end == 0 {
			end = tEnd
		}
		y := top + 4 + float64(i%2)*20
		col := faultColors[f.Kind]
		label := f.String()
		if f.Err != "" {
			label += " (failed: " + f.Err + ")"
		}
		p.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="14" fill="%s" opacity="0.75"><title>%s</title></rect>`+"\n",
			x(f.Start), y, math.Max(2, x(end)-x(f.Start)), col, html.EscapeString(label))
		p.f(`<text x="%.1f" y="%.1f" fill="black">%s</text>`+"\n", x(f.Start)+2, y+11, html.EscapeString(f.String()))
	}
	// The phases after the faults: the settling workload, the final check.
	for _, e := range events {
		label := map[string]string{"settle": "faults over", "final-check": "final check"}[e.What]
		if label == "" {
			continue
		}
		p.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%d" stroke="#333" stroke-dasharray="1,3"/>`+"\n", x(e.T), top, x(e.T), height-40)
		p.f(`<text x="%.1f" y="%.1f" fill="#333">%s</text>`+"\n", x(e.T)+3, top+40, label)
	}
	// dsmd deaths without write-back, across every panel.
	for _, e := range events {
		if e.What == evLoss || e.What == evCrash {
			p.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%d" stroke="#d62728" stroke-dasharray="3,3"><title>%s</title></line>`+"\n",
				x(e.T), top, x(e.T), height-40, html.EscapeString(fmt.Sprintf("n%d: %s %s", e.Node, e.What, e.Detail)))
		}
	}
	top += faultH
	for n := 1; n <= nodes; n++ {
		y0, y1 := top, top+panelH
		y := func(lat float64) float64 {
			l := math.Log10(math.Max(lat, 50e3))
			return y1 - (l-lo)/(hi-lo)*panelH
		}
		p.f(`<rect x="%d" y="%.1f" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", left, y0, width-left-right, panelH)
		p.f(`<text x="4" y="%.1f" font-size="13">n%d</text>`+"\n", y0+14, n)
		for _, tick := range []float64{1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11} {
			if tick > maxLat*1.1 {
				break
			}
			p.f(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#f0f0f0"/>`+"\n", left, y(tick), width-right, y(tick))
			p.f(`<text x="%d" y="%.1f" text-anchor="end" fill="#666">%s</text>`+"\n", left-4, y(tick)+4, time.Duration(tick))
		}
		p.f(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d62728" stroke-dasharray="6,3"><title>deadline %s</title></line>`+"\n",
			left, y(float64(deadline)), width-right, y(float64(deadline)), deadline)
		// The slowest successful operation of every bucket.
		slow := map[int64]float64{}
		fails := map[int64]int{}
		failLat := map[int64]float64{}
		var hung []*Op
		for _, o := range ops {
			if o.Node != n {
				continue
			}
			b := (o.Call - t0) / bucket
			switch {
			case o.Pending():
				hung = append(hung, o)
			case !o.OK:
				fails[b]++
				failLat[b] = math.Max(failLat[b], float64(o.Return-o.Call))
			default:
				slow[b] = math.Max(slow[b], float64(o.Return-o.Call))
			}
		}
		keys := make([]int64, 0, len(slow))
		for b := range slow {
			keys = append(keys, b)
		}
		sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
		// One line per stretch of operations; a gap of a second breaks it.
		var pts []byte
		flush := func() {
			if len(pts) > 0 {
				p.f(`<polyline points="%s" fill="none" stroke="#4c78a8" stroke-width="1.2"/>`+"\n", pts)
			}
			pts = pts[:0]
		}
		for i, b := range keys {
			if i > 0 && b-keys[i-1] > 4 {
				flush()
			}
			pts = fmt.Appendf(pts, "%.1f,%.1f ", x(t0+b*bucket+bucket/2), y(slow[b]))
		}
		flush()
		for b, k := range fails {
			p.f(`<circle cx="%.1f" cy="%.1f" r="%.1f" fill="#ff7f0e" opacity="0.8"><title>%d failed operations</title></circle>`+"\n",
				x(t0+b*bucket+bucket/2), y(failLat[b]), 2+math.Log2(float64(k)), k)
		}
		for i, o := range hung {
			hy := y0 + 4 + float64(i%8)*3
			p.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#d62728" stroke-width="2"><title>%s</title></line>`+"\n",
				x(o.Call), hy, x(tEnd), hy, html.EscapeString(fmt.Sprintf("%s %s at %#x never returned", o.Proc, o.Kind, o.Addr)))
		}
		for _, v := range vs {
			if v.Node != n || v.T == 0 {
				continue
			}
			vx, vy := x(v.T), y1-10
			p.f(`<path d="M%.1f %.1f l8 8 m0 -8 l-8 8" stroke="black" stroke-width="2"><title>%s</title></path>`+"\n",
				vx-4, vy-4, html.EscapeString(v.Checker+": "+v.What))
		}
		top += panelH + 16
	}
	ly := float64(height - 12)
	p.f(`<text x="%d" y="%.1f">blue: slowest successful operation per 250 ms (log scale) · orange: failed operations (size: how many) · red bars: operations that never returned · dashed red: the deadline, dsmd deaths · X: violations</text>`+"\n", left, ly)
	p.f("</svg>\n")
	return p.err
}

type svgWriter struct {
	w   io.Writer
	err error
}

func (s *svgWriter) f(format string, a ...any) {
	if s.err == nil {
		_, s.err = fmt.Fprintf(s.w, format, a...)
	}
}
