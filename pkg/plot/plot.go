package plot

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
	"golang.org/x/image/vector"
)

// Series is one line of a chart. X and Y have the same length; points with
// a NaN coordinate are skipped.
type Series struct {
	Name    string
	X, Y    []float64
	Markers bool // draw a marker at every point (a shape per series: dot, square, triangle, diamond)
}

// Ref is a horizontal reference line at Y, labelled.
type Ref struct {
	Y     float64
	Label string
}

// VRef is a vertical reference line at X, labelled.
type VRef struct {
	X     float64
	Label string
}

// Chart is a line chart.
type Chart struct {
	Title          string
	XLabel, YLabel string
	Series         []Series
	Refs           []Ref
	VRefs          []VRef
	// XMax, when > 0, cuts the x axis there (a long tail would squeeze
	// the rest); lines run off the edge.
	XMax float64
	// YMin and YMax fix the y range when YMax > YMin; otherwise it fits
	// the data (from 0 when every value is ≥ 0).
	YMin, YMax float64
	// Footer is small print under the chart (attribution); "\n" starts
	// a new line.
	Footer string
	// LegendBottom puts the legend in rows under the x-axis label
	// instead of in a column right of the plot area. Either way it lies
	// outside the plot area, so that it hides no point; a legend too
	// wide for a column (a third of the chart) goes under the axis too.
	LegendBottom bool
	// Width and Height in pixels; 0 means 900 × 560.
	Width, Height int
}

// palette is colour-blind-safe (Okabe–Ito).
var palette = []color.RGBA{
	{0, 114, 178, 255},   // blue
	{230, 159, 0, 255},   // orange
	{0, 158, 115, 255},   // green
	{204, 121, 167, 255}, // purple
	{213, 94, 0, 255},    // vermillion
	{86, 180, 233, 255},  // sky
	{0, 0, 0, 255},
}

var (
	ink   = color.RGBA{33, 33, 33, 255}
	faint = color.RGBA{225, 225, 225, 255}
	axis  = color.RGBA{120, 120, 120, 255}
	refC  = color.RGBA{200, 40, 40, 255}
)

const (
	marginL = 78
	marginR = 24
	marginT = 52
	marginB = 64
)

// WritePNG renders c as PNG to w.
func (c *Chart) WritePNG(w io.Writer) error {
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(w, c.Render()); err != nil {
		return fmt.Errorf("plot: encode png: %w", err)
	}
	return nil
}

// Render draws c.
func (c *Chart) Render() *image.RGBA {
	W, H := c.Width, c.Height
	if W == 0 || H == 0 {
		W, H = 900, 560
	}
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	footer := strings.Split(c.Footer, "\n")
	if c.Footer == "" {
		footer = nil
	}
	lay := c.layout(W, H)
	area := lay.area

	xmin, xmax, ymin, ymax := c.bounds()
	xt := ticks(xmin, xmax, 8)
	yt := ticks(ymin, ymax, 7)
	xmin, xmax = math.Min(xmin, xt[0]), math.Max(xmax, xt[len(xt)-1])
	if !(c.YMax > c.YMin) {
		ymin, ymax = math.Min(ymin, yt[0]), math.Max(ymax, yt[len(yt)-1])
	}
	px := func(x float64) float32 {
		return float32(area.Min.X) + float32((x-xmin)/(xmax-xmin))*float32(area.Dx())
	}
	py := func(y float64) float32 {
		return float32(area.Max.Y) - float32((y-ymin)/(ymax-ymin))*float32(area.Dy())
	}

	// Grid and ticks.
	for _, t := range xt {
		if t < xmin || t > xmax {
			continue
		}
		x := int(math.Round(float64(px(t))))
		vline(img, x, area.Min.Y, area.Max.Y, faint)
		label := fmtTick(t, xt)
		text(img, x-textWidth(label)/2, area.Max.Y+16, label, ink)
	}
	for _, t := range yt {
		if t < ymin || t > ymax {
			continue
		}
		y := int(math.Round(float64(py(t))))
		hline(img, area.Min.X, area.Max.X, y, faint)
		label := fmtTick(t, yt)
		text(img, area.Min.X-8-textWidth(label), y+4, label, ink)
	}
	hline(img, area.Min.X, area.Max.X, area.Max.Y, axis)
	vline(img, area.Min.X, area.Min.Y, area.Max.Y, axis)

	// Reference lines.
	for _, r := range c.VRefs {
		if r.X < xmin || r.X > xmax {
			continue
		}
		x := px(r.X)
		vdashed(img, x, float32(area.Min.Y), float32(area.Max.Y), refC)
		text(img, int(x)+4, area.Min.Y+14, r.Label, refC)
	}
	for _, r := range c.Refs {
		if r.Y < ymin || r.Y > ymax {
			continue
		}
		y := py(r.Y)
		dashed(img, float32(area.Min.X), float32(area.Max.X), y, refC)
		text(img, area.Min.X+6, int(y)-5, r.Label, refC)
	}

	// Series, clipped to the plot area (with a small bleed). A series
	// that coincides with an earlier one is drawn dashed, with hollow
	// markers a size larger, so that both stay visible.
	clip := area.Inset(-3)
	same := c.coincident(px, py)
	for i, s := range c.Series {
		col := image.NewUniform(palette[i%len(palette)])
		lines := vector.NewRasterizer(clip.Dx(), clip.Dy())
		var dots *vector.Rasterizer
		if s.Markers {
			dots = vector.NewRasterizer(clip.Dx(), clip.Dy())
		}
		ox, oy := float32(clip.Min.X), float32(clip.Min.Y)
		var prev [2]float32
		have := false
		var dash float32
		for k := range s.X {
			if k >= len(s.Y) || math.IsNaN(s.X[k]) || math.IsNaN(s.Y[k]) {
				have = false
				continue
			}
			p := [2]float32{px(s.X[k]) - ox, py(s.Y[k]) - oy}
			if have {
				if same[i] >= 0 {
					dash = dashedSegment(lines, prev, p, 1.25, dash)
				} else {
					segment(lines, prev, p, 1.25)
				}
			}
			if s.Markers {
				marker(dots, i, p, 3.5, same[i] >= 0)
			}
			prev, have = p, true
		}
		lines.Draw(img, clip, col, image.Point{})
		if s.Markers {
			dots.Draw(img, clip, col, image.Point{})
		}
	}

	// Title, labels, legend, footer.
	text(img, (W-textWidth(c.Title))/2, 24, c.Title, ink)
	if c.YLabel != "" {
		text(img, 8, marginT-12, c.YLabel, ink)
	}
	text(img, area.Min.X+(area.Dx()-textWidth(c.XLabel))/2, area.Max.Y+36, c.XLabel, ink)
	for i, l := range footer {
		text(img, 8, H-10-15*(len(footer)-1-i), l, axis)
	}
	c.legend(img, lay, same)
	return img
}

// layout is where a chart's parts go.
type layout struct {
	area image.Rectangle // the plot area
	// legend is the legend's box, outside area (empty: no legend);
	// below says it is laid out in rows under the x-axis label.
	legend image.Rectangle
	below  bool
	// rows of the legend below: series indices per row.
	rows [][]int
}

// Legend entry geometry: a swatch, a gap, the name.
const (
	swatchW  = 34
	legendRH = 18 // row height
)

// legendName is series i's legend text.
func (c *Chart) legendName(i int, same []int) string {
	n := c.Series[i].Name
	if same != nil && same[i] >= 0 {
		n += " (coincides with " + or(c.Series[same[i]].Name, "another") + ")"
	}
	return n
}

// layout places the plot area and the legend for a W×H image. The
// legend's width allows for "(coincides with …)" on every entry, so that
// the plot area does not depend on the data.
func (c *Chart) layout(W, H int) layout {
	nfoot := 0
	if c.Footer != "" {
		nfoot = strings.Count(c.Footer, "\n") + 1
	}
	var names []int
	wmax := 0
	for i, s := range c.Series {
		if s.Name != "" {
			names = append(names, i)
			wmax = max(wmax, textWidth(s.Name+" (coincides with )")+textWidth(longestName(c.Series)))
		}
	}
	bottom := marginB + 15*nfoot
	var l layout
	if len(names) == 0 {
		l.area = image.Rect(marginL, marginT, W-marginR, H-bottom)
		return l
	}
	colW := wmax + swatchW + 16
	if !c.LegendBottom && colW <= W/3 {
		l.area = image.Rect(marginL, marginT, W-marginR-colW, H-bottom)
		l.legend = image.Rect(l.area.Max.X+12, marginT, W-8, marginT+8+legendRH*len(names))
		return l
	}
	// Rows under the x-axis label, entries side by side.
	l.below = true
	var row []int
	x := 0
	for _, i := range names {
		w := textWidth(c.Series[i].Name+" (coincides with )") + textWidth(longestName(c.Series)) + swatchW + 20
		if len(row) > 0 && x+w > W-marginL-marginR {
			l.rows = append(l.rows, row)
			row, x = nil, 0
		}
		row = append(row, i)
		x += w
	}
	l.rows = append(l.rows, row)
	h := legendRH * len(l.rows)
	l.area = image.Rect(marginL, marginT, W-marginR, H-bottom-h-4)
	l.legend = image.Rect(marginL, l.area.Max.Y+48, W-marginR, l.area.Max.Y+48+h)
	return l
}

func longestName(ss []Series) string {
	n := ""
	for _, s := range ss {
		if len(s.Name) > len(n) {
			n = s.Name
		}
	}
	return n
}

// coincident returns, for each series, the index of an earlier series it
// coincides with on the image (every point within 1.5 pixels of the
// other's point of the same rank, the same number of points), or -1.
func (c *Chart) coincident(px, py func(float64) float32) []int {
	pts := make([][][2]float32, len(c.Series))
	for i, s := range c.Series {
		for k := range s.X {
			if k < len(s.Y) && !math.IsNaN(s.X[k]) && !math.IsNaN(s.Y[k]) {
				pts[i] = append(pts[i], [2]float32{px(s.X[k]), py(s.Y[k])})
			}
		}
	}
	same := make([]int, len(c.Series))
	for i := range same {
		same[i] = -1
		for j := 0; j < i && same[i] < 0; j++ {
			if len(pts[i]) == 0 || len(pts[i]) != len(pts[j]) {
				continue
			}
			ok := true
			for k := range pts[i] {
				if math.Hypot(float64(pts[i][k][0]-pts[j][k][0]), float64(pts[i][k][1]-pts[j][k][1])) > 1.5 {
					ok = false
					break
				}
			}
			if ok {
				same[i] = j
			}
		}
	}
	return same
}

func (c *Chart) legend(img *image.RGBA, l layout, same []int) {
	if l.legend.Empty() {
		return
	}
	entry := func(i, x, y int) int {
		col := palette[i%len(palette)]
		r := image.Rect(x, y-10, x+swatchW, y+4)
		z := vector.NewRasterizer(r.Dx(), r.Dy())
		a, b := [2]float32{3, 6}, [2]float32{swatchW - 3, 6}
		if same[i] >= 0 {
			dashedSegment(z, a, b, 1.5, 0)
		} else {
			segment(z, a, b, 1.5)
		}
		if c.Series[i].Markers {
			marker(z, i, [2]float32{swatchW / 2, 6}, 3.5, same[i] >= 0)
		}
		z.Draw(img, r, image.NewUniform(col), image.Point{})
		name := c.legendName(i, same)
		text(img, x+swatchW+4, y, name, ink)
		return swatchW + 4 + textWidth(name) + 16
	}
	if !l.below {
		row := 0
		for i, s := range c.Series {
			if s.Name != "" {
				entry(i, l.legend.Min.X, l.legend.Min.Y+14+legendRH*row)
				row++
			}
		}
		return
	}
	for r, row := range l.rows {
		x := l.legend.Min.X
		for _, i := range row {
			x += entry(i, x, l.legend.Min.Y+12+legendRH*r)
		}
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// bounds returns the data range, widened when degenerate.
func (c *Chart) bounds() (xmin, xmax, ymin, ymax float64) {
	xmin, ymin = math.Inf(1), math.Inf(1)
	xmax, ymax = math.Inf(-1), math.Inf(-1)
	for _, s := range c.Series {
		for k := range s.X {
			if k >= len(s.Y) || math.IsNaN(s.X[k]) || math.IsNaN(s.Y[k]) || math.IsInf(s.X[k], 0) || math.IsInf(s.Y[k], 0) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.X[k]), math.Max(xmax, s.X[k])
			ymin, ymax = math.Min(ymin, s.Y[k]), math.Max(ymax, s.Y[k])
		}
	}
	for _, r := range c.Refs {
		ymin, ymax = math.Min(ymin, r.Y), math.Max(ymax, r.Y)
	}
	for _, r := range c.VRefs {
		xmin, xmax = math.Min(xmin, r.X), math.Max(xmax, r.X)
	}
	if c.XMax > 0 {
		xmax = c.XMax
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	if xmin >= 0 {
		xmin = 0
	}
	if ymin >= 0 {
		ymin = 0
	}
	if c.YMax > c.YMin {
		ymin, ymax = c.YMin, c.YMax
	}
	if xmax <= xmin {
		xmax = xmin + 1
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	return xmin, xmax, ymin, ymax
}

// ticks returns round tick values (1, 2 or 5 × 10^k apart) covering
// [lo, hi] with at most about n ticks.
func ticks(lo, hi float64, n int) []float64 {
	span := hi - lo
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	start := math.Floor(lo/step) * step
	var out []float64
	for t := start; t <= hi+step*1e-9; t += step {
		out = append(out, math.Round(t/step)*step)
	}
	if out[len(out)-1] < hi {
		out = append(out, out[len(out)-1]+step)
	}
	return out
}

// fmtTick prints t with as many decimals as the tick step needs.
func fmtTick(t float64, all []float64) string {
	dec := 0
	if len(all) > 1 {
		step := all[1] - all[0]
		for dec < 6 && math.Abs(step*math.Pow(10, float64(dec))-math.Round(step*math.Pow(10, float64(dec)))) > 1e-9 {
			dec++
		}
	}
	return strconv.FormatFloat(t, 'f', dec, 64)
}

var face = basicfont.Face7x13

// asciiFor spells common non-ASCII characters in ASCII for the bitmap font.
var asciiFor = strings.NewReplacer("×", "x", "≥", ">=", "≤", "<=", "±", "+-", "—", "-", "–", "-", "÷", "/", "µ", "u", "…", "...")

// ascii returns s with non-ASCII characters spelled in ASCII or replaced
// by '?'.
func ascii(s string) string {
	s = asciiFor.Replace(s)
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, s)
}

func textWidth(s string) int { return font.MeasureString(face, ascii(s)).Round() }

// text draws s with its baseline at y.
func text(img *image.RGBA, x, y int, s string, col color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(col), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(ascii(s))
}

func hline(img *image.RGBA, x0, x1, y int, col color.RGBA) {
	draw.Draw(img, image.Rect(x0, y, x1+1, y+1), image.NewUniform(col), image.Point{}, draw.Src)
}

func vline(img *image.RGBA, x, y0, y1 int, col color.RGBA) {
	draw.Draw(img, image.Rect(x, y0, x+1, y1+1), image.NewUniform(col), image.Point{}, draw.Src)
}

func rect(img *image.RGBA, r image.Rectangle, col color.RGBA) {
	hline(img, r.Min.X, r.Max.X, r.Min.Y, col)
	hline(img, r.Min.X, r.Max.X, r.Max.Y, col)
	vline(img, r.Min.X, r.Min.Y, r.Max.Y, col)
	vline(img, r.Max.X, r.Min.Y, r.Max.Y, col)
}

func dashed(img *image.RGBA, x0, x1, y float32, col color.Color) {
	r := image.Rect(int(x0)-2, int(y)-3, int(x1)+3, int(y)+4)
	z := vector.NewRasterizer(r.Dx(), r.Dy())
	ox, oy := float32(r.Min.X), float32(r.Min.Y)
	for x := x0; x < x1; x += 12 {
		segment(z, [2]float32{x - ox, y - oy}, [2]float32{min(x+7, x1) - ox, y - oy}, 0.9)
	}
	z.Draw(img, r, image.NewUniform(col), image.Point{})
}

func vdashed(img *image.RGBA, x, y0, y1 float32, col color.Color) {
	r := image.Rect(int(x)-3, int(y0)-2, int(x)+4, int(y1)+3)
	z := vector.NewRasterizer(r.Dx(), r.Dy())
	ox, oy := float32(r.Min.X), float32(r.Min.Y)
	for y := y0; y < y1; y += 12 {
		segment(z, [2]float32{x - ox, y - oy}, [2]float32{x - ox, min(y+7, y1) - oy}, 0.9)
	}
	z.Draw(img, r, image.NewUniform(col), image.Point{})
}

// segment adds a line of half-width hw from a to b (a quad with square
// ends) to z.
func segment(z *vector.Rasterizer, a, b [2]float32, hw float32) {
	dx, dy := b[0]-a[0], b[1]-a[1]
	l := float32(math.Hypot(float64(dx), float64(dy)))
	if l == 0 {
		return
	}
	nx, ny := -dy/l*hw, dx/l*hw
	ex, ey := dx/l*hw*0.5, dy/l*hw*0.5 // extend to cover joins
	// Every quad has the same orientation, so overlaps add coverage
	// instead of cancelling it.
	q := [4][2]float32{
		{a[0] - ex + nx, a[1] - ey + ny},
		{b[0] + ex + nx, b[1] + ey + ny},
		{b[0] + ex - nx, b[1] + ey - ny},
		{a[0] - ex - nx, a[1] - ey - ny},
	}
	z.MoveTo(q[0][0], q[0][1])
	for _, v := range q[1:] {
		z.LineTo(v[0], v[1])
	}
	z.ClosePath()
}

// dashedSegment adds a dashed line of half-width hw from a to b to z,
// dashes of 7 pixels with gaps of 4, starting phase pixels into the
// pattern; it returns the phase at b, so that a polyline's dashes run on.
func dashedSegment(z *vector.Rasterizer, a, b [2]float32, hw, phase float32) float32 {
	const on, period = 7, 11
	dx, dy := b[0]-a[0], b[1]-a[1]
	l := float32(math.Hypot(float64(dx), float64(dy)))
	if l == 0 {
		return phase
	}
	ux, uy := dx/l, dy/l
	for t := -phase; t < l; t += period {
		t0, t1 := max(t, 0), min(t+on, l)
		if t1 > t0 {
			segment(z, [2]float32{a[0] + ux*t0, a[1] + uy*t0}, [2]float32{a[0] + ux*t1, a[1] + uy*t1}, hw)
		}
	}
	return float32(math.Mod(float64(phase+l), period))
}

// marker adds series i's marker at p, of radius about r, to z: a dot,
// square, triangle or diamond by i; hollow (a ring of the shape, a
// size larger) when the series coincides with an earlier one.
func marker(z *vector.Rasterizer, i int, p [2]float32, r float32, hollow bool) {
	shape := func(r float32, reverse bool) {
		var vs [][2]float32
		switch i % 4 {
		case 0:
			const n = 16
			for k := range n {
				a := 2 * math.Pi * float64(k) / n
				vs = append(vs, [2]float32{p[0] + r*float32(math.Cos(a)), p[1] + r*float32(math.Sin(a))})
			}
		case 1:
			q := r * 0.9
			vs = [][2]float32{{p[0] - q, p[1] - q}, {p[0] + q, p[1] - q}, {p[0] + q, p[1] + q}, {p[0] - q, p[1] + q}}
		case 2:
			q := r * 1.2
			vs = [][2]float32{{p[0], p[1] - q}, {p[0] + q*0.87, p[1] + q*0.5}, {p[0] - q*0.87, p[1] + q*0.5}}
		default:
			q := r * 1.2
			vs = [][2]float32{{p[0], p[1] - q}, {p[0] + q, p[1]}, {p[0], p[1] + q}, {p[0] - q, p[1]}}
		}
		if reverse {
			slices.Reverse(vs)
		}
		z.MoveTo(vs[0][0], vs[0][1])
		for _, v := range vs[1:] {
			z.LineTo(v[0], v[1])
		}
		z.ClosePath()
	}
	if !hollow {
		shape(r, false)
		return
	}
	// A ring: the outer shape, and the inner one wound the other way.
	shape(r+2.5, false)
	shape(r+1, true)
}

// CDF returns a series of the empirical CDF of xs (any order; not
// modified): x sorted, y = rank / n, thinned to at most max points
// (max ≤ 0 means 1000).
func CDF(name string, xs []float64, max int) Series {
	if max <= 0 {
		max = 1000
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	out := Series{Name: name}
	if n == 0 {
		return out
	}
	step := 1
	if n > max {
		step = (n + max - 1) / max
	}
	for i := 0; i < n; i += step {
		out.X = append(out.X, s[i])
		out.Y = append(out.Y, float64(i+1)/float64(n))
	}
	if out.X[len(out.X)-1] != s[n-1] || out.Y[len(out.Y)-1] != 1 {
		out.X = append(out.X, s[n-1])
		out.Y = append(out.Y, 1)
	}
	return out
}
