package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
func jsonMarshal(v any) ([]byte, error)   { return json.Marshal(v) }

// median of float samples (NaN when there are none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// row is one line of the result table.
type row struct {
	metric     string
	village    float64
	reference  float64 // NaN: no reference column
	unit       string
	ratio      float64 // NaN: computed from village/reference
	target     string
	met        string // "yes", "NO", or "" (informational)
	comparison string // what the ratio compares, when not village/reference
	load       string // 1-minute load average when its section began and when the row was taken
}

type table struct {
	title     string
	rows      []row
	sectionAt string            // 1-minute load average when the current section began
	after     []func(io.Writer) // sections' own tables, printed after this one
}

// section marks the start of a section: its rows say the machine's load
// from here to when each is added.
func (t *table) section() { t.sectionAt = loadavg()[0] }

func (t *table) add(r row) {
	if math.IsNaN(r.ratio) && !math.IsNaN(r.reference) && r.reference != 0 {
		r.ratio = r.village / r.reference
	}
	if t.sectionAt == "" {
		t.section()
	}
	r.load = t.sectionAt + "→" + loadavg()[0]
	t.rows = append(t.rows, r)
}

// loadavg is /proc/loadavg's 1, 5 and 15 minute load averages (what
// uptime prints); "?" each when it cannot be read.
func loadavg() [3]string {
	out := [3]string{"?", "?", "?"}
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return out
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		out[i] = f[i]
	}
	return out
}

func fmtNum(v float64, unit string) string {
	if math.IsNaN(v) {
		return "-"
	}
	switch {
	case unit == "MB" || unit == "Gbit/s":
		return fmt.Sprintf("%.2f %s", v, unit)
	case v >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	default:
		return fmt.Sprintf("%.1f %s", v, unit)
	}
}

// print writes the table as Markdown (readable in a terminal, pasteable in
// the README).
func (t *table) print(w io.Writer) {
	fmt.Fprintf(w, "\n%s\n\n", t.title)
	fmt.Fprintln(w, "| measurement | village | reference / baseline | ratio | target | met | load 1 min (section start→row) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---|---|")
	for _, r := range t.rows {
		ratio := "-"
		if !math.IsNaN(r.ratio) {
			ratio = fmt.Sprintf("%.2f×", r.ratio)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.metric, fmtNum(r.village, r.unit), fmtNum(r.reference, r.unit),
			ratio, r.target, r.met, r.load)
	}
	for _, f := range t.after {
		f(w)
	}
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**NO**"
}

// samples collects named float series.
type samples map[string][]float64

func (s samples) add(key string, v float64) { s[key] = append(s[key], v) }
func (s samples) med(key string) float64    { return median(s[key]) }

func (s samples) summary(key string) string {
	xs := slices.Clone(s[key])
	if len(xs) == 0 {
		return key + ": none"
	}
	slices.Sort(xs)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: n=%d min=%.1f med=%.1f max=%.1f", key, len(xs), xs[0], median(xs), xs[len(xs)-1])
	return b.String()
}
