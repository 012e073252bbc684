package main

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// masqOffRound is one round of the masqoff section: per-suite medians of
// its ADDs and DELs (wall and above the exec floor) and the load when it
// began and ended.
type masqOffRound struct {
	first      string // the suite that went first on the round's first pod
	v, r       map[string]float64
	start, end [3]string
}

// masqOff: ADD then DEL of o.seq pods per suite with ipMasq off, o.masqOffRounds
// times, each round on fresh pods and its first suite swapping every round
// (and the order swapping every pod within it), each operation followed by
// the exec floor on the same pod. Every round is summarised on its own, and
// the table reports the median of the rounds' ratios with their spread, so a
// load spike shows up as one outlying round rather than as the figure.
func masqOff(l *lab, o options, v, r *suite, t *table) error {
	logf("masqoff: %d rounds of %d pods per suite, ipMasq off", o.masqOffRounds, o.seq)
	var rounds []masqOffRound
	for round := 0; round < o.masqOffRounds; round++ {
		rs := samples{}
		rd := masqOffRound{first: order(round, v, r)[0].name, start: loadavg()}
		// Each round's sequential runs in its own loop: the pod i pairs
		// alternate with order(round+i), so the round's first pair swaps
		// from one round to the next.
		if err := sequentialFrom(l, o, v, r, rs, []string{"nomasq"}, "", round); err != nil {
			return err
		}
		rd.end = loadavg()
		rd.v, rd.r = map[string]float64{}, map[string]float64{}
		for _, k := range masqOffKeys {
			rd.v[k], rd.r[k] = rs.med("v."+k), rs.med("r."+k)
		}
		logf("masqoff round %d: ADD %.1f/%.1f ms (%.2f×), DEL %.1f/%.1f ms (%.2f×), load %s → %s", round+1,
			rd.v["nomasq.add"], rd.r["nomasq.add"], rd.v["nomasq.add"]/rd.r["nomasq.add"],
			rd.v["nomasq.del"], rd.r["nomasq.del"], rd.v["nomasq.del"]/rd.r["nomasq.del"], rd.start[0], rd.end[0])
		rounds = append(rounds, rd)
	}
	// The target (0.50×) holds the ADD both whole and above the floor.
	rows := [][2]string{{"nomasq.add", "ADD"}, {"nomasq.del", "DEL"},
		{"gap.nomasq.add", "ADD above the exec floor"}, {"gap.nomasq.del", "DEL above the exec floor"}}
	for _, c := range rows {
		key, what := c[0], c[1]
		var vs, rfs, ratios []float64
		for _, rd := range rounds {
			vs, rfs = append(vs, rd.v[key]), append(rfs, rd.r[key])
			ratios = append(ratios, rd.v[key]/rd.r[key])
		}
		sp := spreadOf(ratios)
		rw := row{metric: fmt.Sprintf("%s, ipMasq off, sequential, %d rounds × %d pods (median of round medians; ratio: median of round ratios, spread %s)",
			what, len(rounds), o.seq, sp), village: median(vs), reference: median(rfs), unit: "ms", ratio: sp.median}
		if strings.HasSuffix(key, ".add") {
			rw.target, rw.met = "≤ 0.50×", yes(sp.median <= 0.5)
		}
		t.add(rw)
	}
	t.after = append(t.after, func(w io.Writer) { printMasqOffRounds(w, rounds) })
	return nil
}

// masqOffKeys are the series each round summarises (suite prefix left off).
var masqOffKeys = []string{"nomasq.add", "nomasq.del", "gap.nomasq.add", "gap.nomasq.del"}

// printMasqOffRounds writes one line per round: medians, ratios and the
// load averages (1, 5, 15 min) at its start and end.
func printMasqOffRounds(w io.Writer, rounds []masqOffRound) {
	fmt.Fprintf(w, "\nipMasq off, round by round (medians, village / reference, ms)\n\n")
	fmt.Fprintln(w, "| round | first | ADD | ratio | DEL | ratio | ADD above floor | ratio | DEL above floor | ratio | load at start | load at end |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
	for i, rd := range rounds {
		var cells []string
		for _, k := range masqOffKeys {
			cells = append(cells, fmt.Sprintf("%.1f / %.1f", rd.v[k], rd.r[k]), fmt.Sprintf("%.2f×", rd.v[k]/rd.r[k]))
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s |\n", i+1, rd.first, strings.Join(cells, " | "),
			strings.Join(rd.start[:], " "), strings.Join(rd.end[:], " "))
	}
}

// spread is a series of per-round ratios reduced to its median and range.
type spread struct{ median, min, max float64 }

// spreadOf summarises xs; every field is NaN when xs is empty.
func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{math.NaN(), math.NaN(), math.NaN()}
	}
	sp := spread{median: median(xs), min: xs[0], max: xs[0]}
	for _, x := range xs[1:] {
		sp.min, sp.max = math.Min(sp.min, x), math.Max(sp.max, x)
	}
	return sp
}

func (sp spread) String() string {
	if math.IsNaN(sp.median) {
		return "-"
	}
	return fmt.Sprintf("%.2f–%.2f×", sp.min, sp.max)
}
