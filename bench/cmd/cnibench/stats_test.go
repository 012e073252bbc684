package main

import (
	"math"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []float64
		want float64
	}{
		{"none", nil, math.NaN()},
		{"one", []float64{3}, 3},
		{"odd, unsorted", []float64{5, 1, 3}, 3},
		{"even: mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"repeats", []float64{2, 2, 9, 2}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := append([]float64(nil), c.in...)
			got := median(c.in)
			if !same(got, c.want) {
				t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
			}
			for i := range in {
				if in[i] != c.in[i] {
					t.Errorf("median reordered its input: %v, was %v", c.in, in)
				}
			}
		})
	}
}

func TestSpreadOf(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		name string
		in   []float64
		want spread
		text string
	}{
		{"no rounds", nil, spread{nan, nan, nan}, "-"},
		{"one round", []float64{0.62}, spread{0.62, 0.62, 0.62}, "0.62–0.62×"},
		{"three rounds, one outlier", []float64{0.78, 0.21, 0.62}, spread{0.62, 0.21, 0.78}, "0.21–0.78×"},
		{"five rounds", []float64{0.4, 0.5, 0.45, 0.3, 0.6}, spread{0.45, 0.3, 0.6}, "0.30–0.60×"},
		{"even count", []float64{0.5, 0.3}, spread{0.4, 0.3, 0.5}, "0.30–0.50×"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := spreadOf(c.in)
			if !same(got.median, c.want.median) || !same(got.min, c.want.min) || !same(got.max, c.want.max) {
				t.Errorf("spreadOf(%v) = %+v, want %+v", c.in, got, c.want)
			}
			if s := got.String(); s != c.text {
				t.Errorf("spreadOf(%v).String() = %q, want %q", c.in, s, c.text)
			}
		})
	}
}

// same is == with NaN equal to NaN, and a little room for the float
// arithmetic of a mean.
func same(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return math.Abs(a-b) < 1e-9
}
