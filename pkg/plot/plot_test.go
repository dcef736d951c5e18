package plot

import (
	"bytes"
	"image/color"
	"image/png"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		n      int
		want   []float64
	}{
		{0, 1, 5, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
		{0, 1000, 8, []float64{0, 200, 400, 600, 800, 1000}},
		{0, 7, 7, []float64{0, 1, 2, 3, 4, 5, 6, 7}},
		{0, 0.9, 8, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
		{0, 33, 8, []float64{0, 5, 10, 15, 20, 25, 30, 35}},
	} {
		if got := ticks(tc.lo, tc.hi, tc.n); !cmp.Equal(tc.want, got, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })) {
			t.Errorf("ticks(%v, %v, %d) = %v, want %v", tc.lo, tc.hi, tc.n, got, tc.want)
		}
	}
	if got := fmtTick(0.4, []float64{0, 0.2, 0.4}); got != "0.4" {
		t.Errorf("fmtTick = %q, want 0.4", got)
	}
	if got := fmtTick(400, []float64{0, 200, 400}); got != "400" {
		t.Errorf("fmtTick = %q, want 400", got)
	}
}

func TestCDF(t *testing.T) {
	s := CDF("x", []float64{3, 1, 2, 4}, 0)
	if diff := cmp.Diff(Series{Name: "x", X: []float64{1, 2, 3, 4}, Y: []float64{0.25, 0.5, 0.75, 1}}, s); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	xs := make([]float64, 10001)
	for i := range xs {
		xs[i] = float64(i)
	}
	s = CDF("big", xs, 100)
	if len(s.X) > 102 || s.X[len(s.X)-1] != 10000 || s.Y[len(s.Y)-1] != 1 {
		t.Errorf("thinned CDF: %d points ending at (%v, %v)", len(s.X), s.X[len(s.X)-1], s.Y[len(s.Y)-1])
	}
	if s := CDF("empty", nil, 0); len(s.X) != 0 {
		t.Errorf("empty CDF has %d points", len(s.X))
	}
}

// The rendered chart is a PNG of the asked size with the series drawn in
// its palette colour where the data is.
func TestRender(t *testing.T) {
	c := Chart{
		Title: "t", XLabel: "x", YLabel: "y", Width: 400, Height: 300, YMin: 0, YMax: 1,
		Series: []Series{{Name: "a", X: []float64{0, 10}, Y: []float64{0.5, 0.5}}},
		Refs:   []Ref{{Y: 0.9, Label: "target"}},
		Footer: "data: somebody, 2024",
	}
	var buf bytes.Buffer
	if err := c.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 400 || b.Dy() != 300 {
		t.Fatalf("size %v, want 400×300", b)
	}
	// y = 0.5 lies halfway down the plot area; x = 5 halfway across.
	bottom := 300 - marginB - 15
	y := marginT + (bottom-marginT)/2
	x := marginL + (400-marginR-marginL)/2
	want := color.RGBAModel.Convert(palette[0])
	if got := color.RGBAModel.Convert(img.At(x, y)); got != want {
		t.Errorf("pixel at the line (%d, %d) is %v, want %v", x, y, got, want)
	}
	if got := color.RGBAModel.Convert(img.At(x, y+20)); got == want {
		t.Errorf("pixel off the line has the series colour")
	}
}

func TestRenderEmptyChart(t *testing.T) {
	c := Chart{Title: "nothing"}
	if img := c.Render(); img.Bounds().Dx() != 900 {
		t.Errorf("default width %d, want 900", img.Bounds().Dx())
	}
}

func TestASCII(t *testing.T) {
	if got := ascii("×0.5 ≥ 3 — ok é"); got != "x0.5 >= 3 - ok ?" {
		t.Errorf("ascii = %q", got)
	}
}
