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
	area := c.layout(400, 300).area
	y := area.Min.Y + area.Dy()/2
	x := area.Min.X + area.Dx()/2
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

// The legend lies outside the plot area, so that a point in the
// top-right corner (where a legend used to be) stays visible, in a column
// on the right or, with LegendBottom, under the axis.
func TestLegendOutsidePlotArea(t *testing.T) {
	for _, bottom := range []bool{false, true} {
		c := Chart{Width: 600, Height: 400, LegendBottom: bottom, YMin: 0, YMax: 1, XMax: 1,
			Series: []Series{{Name: "a series with a long name", X: []float64{0, 1}, Y: []float64{0, 1}, Markers: true}}}
		l := c.layout(600, 400)
		if l.legend.Empty() || l.legend.Overlaps(l.area) {
			t.Errorf("bottom %v: legend %v overlaps the plot area %v", bottom, l.legend, l.area)
		}
		img := c.Render()
		want := color.RGBAModel.Convert(palette[0])
		if got := color.RGBAModel.Convert(img.At(l.area.Max.X-1, l.area.Min.Y+1)); got != want {
			t.Errorf("bottom %v: the top-right point's pixel is %v, want the series colour %v", bottom, got, want)
		}
	}
}

// Two series on the same points both show: the later one dashed with
// hollow markers of another shape, and the legend says it coincides.
func TestCoincidentSeries(t *testing.T) {
	xs, ys := []float64{0, 0.5, 1}, []float64{0.2, 0.6, 0.4}
	c := Chart{Width: 600, Height: 400, YMin: 0, YMax: 1, XMax: 1, Series: []Series{
		{Name: "disaggregated", X: xs, Y: ys, Markers: true},
		{Name: "colocated", X: xs, Y: []float64{0.2, 0.6, 0.4 + 1e-4}, Markers: true},
		{Name: "other", X: xs, Y: []float64{0.9, 0.9, 0.9}, Markers: true},
	}}
	l := c.layout(600, 400)
	px := func(x float64) float32 { return float32(l.area.Min.X) + float32(x)*float32(l.area.Dx()) }
	py := func(y float64) float32 { return float32(l.area.Max.Y) - float32(y)*float32(l.area.Dy()) }
	same := c.coincident(px, py)
	if diff := cmp.Diff([]int{-1, 0, -1}, same); diff != "" {
		t.Fatalf("coincident (-want +got):\n%s", diff)
	}
	if got := c.legendName(1, same); got != "colocated (coincides with disaggregated)" {
		t.Errorf("legend name %q", got)
	}
	img := c.Render()
	count := func(col color.RGBA) int {
		n := 0
		for y := l.area.Min.Y; y <= l.area.Max.Y; y++ {
			for x := l.area.Min.X; x <= l.area.Max.X; x++ {
				if color.RGBAModel.Convert(img.At(x, y)) == col {
					n++
				}
			}
		}
		return n
	}
	if a, b := count(palette[0]), count(palette[1]); a < 50 || b < 50 {
		t.Errorf("pixels of the first series %d, of the coinciding one %d: one is hidden", a, b)
	}
}
