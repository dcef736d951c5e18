package profiler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/perfmodel"
)

// Settings bound what Measure runs. Zero fields take the defaults noted.
type Settings struct {
	// Budget is the wall time the measurement may take (> 0). The grid
	// grows level by level while the next level's predicted time fits.
	Budget time.Duration
	// Repeats is the timed repetitions per point (the point is their
	// median); 0 means 3.
	Repeats int
	// MaxTokens is the longest prompt and the longest decode context
	// measured; 0 means 2048. It is capped by the engine's sequence
	// length and KV cache.
	MaxTokens int
	// MaxBatch is the largest decode batch measured; 0 means 32. It is
	// capped by the engine's sequence slots and KV cache.
	MaxBatch int
	// Seed fixes the random prompt tokens.
	Seed uint64
	// Now is the clock (nil: time.Now). Step times are differences of it.
	Now func() time.Time
	// Progress, when set, is told after every point.
	Progress func(Progress)
}

// Progress is the state of a measurement after a point.
type Progress struct {
	Level     int           // the grid level being measured, from 0
	Done      int           // points measured so far
	Planned   int           // points planned so far (grows with the levels)
	Elapsed   time.Duration // time since the start
	Budget    time.Duration
	LastPoint string // the point just measured
}

// Result is what Measure found.
type Result struct {
	Points []perfmodel.Point // the measured step_ms points, check "fit", no rel_err yet
	// KVBytesPerToken is the KV of one token as the engine exported it
	// (bytes of every layer's canonical KV of a sequence ÷ its tokens), 0
	// when the engine cannot export it.
	KVBytesPerToken int64
	// KVNote says how KVBytesPerToken was obtained.
	KVNote string
	// Grid says what was measured and what the budget left out.
	Grid    string
	Elapsed time.Duration
	Repeats int
}

// Capacity is implemented by engines with a fixed KV cache (llama.cpp):
// tokens over all sequences, and sequences held at once.
type Capacity interface {
	KVCapacity() (tokens, seqs int)
}

// Point kinds.
const (
	kindPrefill = iota
	kindDecode
	kindMixed
)

// task is one grid point: a prefill of k prompts of l tokens, a decode
// step of b sequences at context n, or a mixed step of one l-token chunk
// and b decoding sequences at context n.
type task struct {
	kind       int
	k, l, b, n int
	level      int
}

func (t task) name() string {
	switch t.kind {
	case kindPrefill:
		return fmt.Sprintf("prefill %dx%d", t.k, t.l)
	case kindDecode:
		return fmt.Sprintf("decode %dx%d", t.b, t.n)
	}
	return fmt.Sprintf("mixed %d+%dx%d", t.l, t.b, t.n)
}

// levelOf is the smallest level whose limits hold the task: tokens ≤
// 32·2^level, batch ≤ 2·2^level.
func levelOf(tokens, batch int) int {
	lv := 0
	for 32<<lv < tokens || 2<<lv < batch {
		lv++
	}
	return lv
}

// limits are the grid's bounds on one engine.
type limits struct {
	maxTokens, maxBatch, cells int
	// steps bounds the decode steps a live sequence takes within one
	// context group (a warm-up and the repeats of every batch size and
	// mixed step), for the room the grid keeps in the cache.
	steps int
}

// decodeContexts are the decode contexts of the grid, before limits.
var decodeContexts = []int{16, 32, 128, 512, 2048, 8192, 32768}

// The mixed steps of the grid, before limits: one chunk of each length
// beside each decode batch at each context (both contexts are decode
// contexts too, so mixed steps reuse those groups' sequences).
var (
	mixedContexts = []int{32, 512}
	mixedChunks   = []int{16, 128, 384}
	mixedBatches  = []int{2, 4, 16}
)

// decodeBatches are the decode batch sizes of the grid up to max: 1, 2, 3
// and the powers of two from 4. Batch 3 places a decode regime switch
// just past a batch of one or two (llama.cpp's CPU backend runs one token
// through other kernels than two), so that the fit does not stretch one
// regime's per-sequence slope over a batch size it never measured.
func decodeBatches(max int) []int {
	var bs []int
	for _, b := range []int{1, 2, 3} {
		if b <= max {
			bs = append(bs, b)
		}
	}
	for b := 4; b <= max; b *= 2 {
		bs = append(bs, b)
	}
	return bs
}

// grid returns every task within lim, by level.
func grid(lim limits) []task {
	var ts []task
	add := func(t task) {
		tokens := max(t.k*t.l, t.n, t.l)
		t.level = levelOf(tokens, max(t.b, t.k))
		ts = append(ts, t)
	}
	for l := 16; l <= lim.maxTokens; l *= 2 {
		add(task{kind: kindPrefill, k: 1, l: l})
		for _, k := range []int{2, 4} {
			if l <= 256 && k*l <= lim.maxTokens && k <= lim.maxBatch {
				add(task{kind: kindPrefill, k: k, l: l})
			}
		}
	}
	// Room left in the cache beside a decode batch: the extra tokens its
	// steps add, and a mixed step's chunk.
	spare := func(b, l int) int { return b*(lim.steps+1) + l }
	for _, n := range decodeContexts {
		if n > lim.maxTokens {
			break
		}
		for _, b := range decodeBatches(lim.maxBatch) {
			if b*n+spare(b, 0) <= lim.cells {
				add(task{kind: kindDecode, b: b, n: n})
			}
		}
	}
	// Mixed steps: chunk lengths and decode batches and contexts varied
	// apart, for the interaction terms of the fit (perfmodel.DistServe's
	// Mixed: per decode context token, and per chunk token × decode
	// context token). Chunks stay short of llama.cpp's 512-token ubatch,
	// as a colocated worker's chunked steps do: a longer step is split
	// and its parts no longer interact.
	for _, n := range mixedContexts {
		for _, l := range mixedChunks {
			for _, b := range mixedBatches {
				if n <= lim.maxTokens && l <= lim.maxTokens && b <= lim.maxBatch &&
					b*n+spare(b, l) <= lim.cells {
					add(task{kind: kindMixed, l: l, b: b, n: n})
				}
			}
		}
	}
	return ts
}

// ErrBudget: the budget did not allow even the smallest grid level.
var ErrBudget = errors.New("profiler: budget too small for the smallest grid")

// Measure runs the grid on e, level by level, within s.Budget, and returns
// the measured points. The engine must be idle: Measure creates and frees
// its own sequences (ids from 1<<40). Errors: ErrBudget, the engine's
// errors, ctx's error.
func Measure(ctx context.Context, e engine.Engine, s Settings) (*Result, error) {
	if s.Budget <= 0 {
		return nil, fmt.Errorf("profiler: budget %v must be > 0", s.Budget)
	}
	if s.Repeats == 0 {
		s.Repeats = 3
	}
	if s.Repeats < 1 {
		return nil, fmt.Errorf("profiler: repeats %d must be ≥ 1", s.Repeats)
	}
	if s.MaxTokens == 0 {
		s.MaxTokens = 2048
	}
	if s.MaxBatch == 0 {
		s.MaxBatch = 32
	}
	if s.MaxTokens < 32 || s.MaxBatch < 2 {
		return nil, fmt.Errorf("profiler: max tokens %d must be ≥ 32 and max batch %d ≥ 2", s.MaxTokens, s.MaxBatch)
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	spec := e.Spec()
	// Batch sizes double from 1 to MaxBatch, and a context group runs
	// each once as decode and at most once per chunk length as mixed.
	sizes := bits.Len(uint(s.MaxBatch))
	steps := sizes * ((1+len(mixedChunks))*s.Repeats + 1)
	lim := limits{
		maxTokens: min(s.MaxTokens, spec.MaxSeqLen-steps-1),
		maxBatch:  s.MaxBatch,
		cells:     math.MaxInt / 4,
		steps:     steps,
	}
	if c, ok := e.(Capacity); ok {
		tokens, seqs := c.KVCapacity()
		lim.cells = tokens
		lim.maxBatch = min(lim.maxBatch, seqs-1) // one slot for a mixed step's chunk
		lim.maxTokens = min(lim.maxTokens, tokens-steps-1)
	}
	if lim.maxTokens < 32 || lim.maxBatch < 2 {
		return nil, fmt.Errorf("profiler: the engine allows prompts of %d tokens and batches of %d; need ≥ 32 and ≥ 2", lim.maxTokens, lim.maxBatch)
	}
	m := &measurer{e: e, s: s, vocab: spec.Vocab, rng: rand.New(rand.NewPCG(s.Seed, 0x9e3779b9)), next: 1 << 40,
		tokens: map[engine.SeqID]int32{}}
	m.start = s.Now()
	all := grid(lim)
	maxLevel := 0
	for _, t := range all {
		maxLevel = max(maxLevel, t.level)
	}
	if err := m.warmUp(ctx); err != nil {
		return nil, err
	}
	res := &Result{Repeats: s.Repeats}
	var skipped []string
	planned := 0
	for lv := 0; lv <= maxLevel; lv++ {
		var level []task
		for _, t := range all {
			if t.level == lv {
				level = append(level, t)
			}
		}
		if lv > 0 {
			level, skipped = m.fit(level, skipped)
			if len(level) == 0 {
				break
			}
		}
		planned += len(level)
		done, err := m.run(ctx, level, lv, planned)
		m.freeAll()
		if err != nil {
			return nil, err
		}
		if done < len(level) { // ran past the budget
			for _, t := range level[done:] {
				skipped = append(skipped, t.name())
			}
			break
		}
	}
	if len(m.points) == 0 {
		return nil, ErrBudget
	}
	res.Points = m.points
	res.KVBytesPerToken, res.KVNote = m.kvBytes, m.kvNote
	res.Elapsed = s.Now().Sub(m.start)
	res.Grid = describeGrid(m.points, skipped, lim)
	return res, nil
}

type measurer struct {
	e      engine.Engine
	s      Settings
	vocab  int
	rng    *rand.Rand
	next   engine.SeqID
	start  time.Time
	points []perfmodel.Point

	live   []engine.SeqID         // decoding sequences of the current context group
	tokens map[engine.SeqID]int32 // each live sequence's last sampled token

	kvBytes int64
	kvNote  string
}

// fit keeps the tasks of the next level whose predicted time fits the
// budget left, cheapest first, by the profile fitted to the points so far.
func (m *measurer) fit(level []task, skipped []string) ([]task, []string) {
	d, err := perfmodel.FitDistServe(m.points)
	if err != nil { // too few points to predict: run the level and let the deadline guard it
		return level, skipped
	}
	p := &perfmodel.Profile{Form: perfmodel.FormDistServe, DistServe: d}
	left := m.s.Budget - m.s.Now().Sub(m.start)
	type costed struct {
		t task
		c time.Duration
	}
	cs := make([]costed, len(level))
	for i, t := range level {
		cs[i] = costed{t, m.predict(p, t)}
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].c < cs[j].c })
	var keep []task
	var sum time.Duration
	for _, c := range cs {
		if sum+c.c > left {
			skipped = append(skipped, c.t.name())
			continue
		}
		sum += c.c
		keep = append(keep, c.t)
	}
	// Run in grid order (it groups decode batches by context).
	slices.SortStableFunc(keep, func(a, b task) int { return order(a) - order(b) })
	return keep, skipped
}

// order sorts prefill first, then decode and mixed by context and batch.
func order(t task) int {
	return t.kind<<40 | t.n<<16 | t.b<<8 | t.k
}

// predict is the time one task takes by p: its timed steps, warm-ups and
// the prefill that sets up its decoding sequences (counted in full, as if
// no other task shared them).
func (m *measurer) predict(p *perfmodel.Profile, t task) time.Duration {
	r := float64(m.s.Repeats)
	ctx := make([]int, t.b)
	for i := range ctx {
		ctx[i] = t.n
	}
	setup := float64(t.b) * p.StepSeconds(perfmodel.Batch{Prefill: []int{t.n}})
	var s float64
	switch t.kind {
	case kindPrefill:
		ls := make([]int, t.k)
		for i := range ls {
			ls[i] = t.l
		}
		s = r * p.StepSeconds(perfmodel.Batch{Prefill: ls})
	case kindDecode:
		s = setup + (r+1)*p.StepSeconds(perfmodel.Batch{Decode: ctx})
	default:
		s = setup + r*p.StepSeconds(perfmodel.Batch{Prefill: []int{t.l}, Decode: ctx})
	}
	return time.Duration(s * 1.2 * 1e9) // 20% for what the model misses
}

func (m *measurer) prompt(n int) []int32 {
	toks := make([]int32, n)
	lo := int32(min(4, m.vocab-1)) // clear of the usual special ids
	for i := range toks {
		toks[i] = lo + int32(m.rng.IntN(m.vocab-int(lo)))
	}
	return toks
}

func (m *measurer) id() engine.SeqID { m.next++; return m.next }

// warmUp runs a small prefill and decode untimed (first-call costs:
// buffers, thread pools, caches).
func (m *measurer) warmUp(ctx context.Context) error {
	id := m.id()
	out, err := m.e.Prefill(ctx, []engine.PrefillItem{{Seq: id, Tokens: m.prompt(16), Last: true}}, nil)
	if err == nil {
		_, err = m.e.Decode(ctx, []engine.DecodeItem{{Seq: id, Token: out[0].Token}})
	}
	m.e.Free(id)
	if err != nil {
		return fmt.Errorf("profiler: warm-up: %w", err)
	}
	return nil
}

func (m *measurer) freeAll() {
	for _, id := range m.live {
		m.e.Free(id)
		delete(m.tokens, id)
	}
	m.live = m.live[:0]
}

// run measures the tasks of one level in order and returns how many it
// finished before the deadline.
func (m *measurer) run(ctx context.Context, ts []task, lv, planned int) (int, error) {
	groupN := -1
	for i, t := range ts {
		if m.s.Now().Sub(m.start) > m.s.Budget {
			return i, nil
		}
		if t.kind != kindPrefill && t.n != groupN {
			m.freeAll() // a new context group
			groupN = t.n
		}
		var pt perfmodel.Point
		var err error
		switch t.kind {
		case kindPrefill:
			pt, err = m.prefill(ctx, t)
		case kindDecode:
			pt, err = m.decode(ctx, t)
		default:
			pt, err = m.mixed(ctx, t)
		}
		if err != nil {
			return i, fmt.Errorf("profiler: %s: %w", t.name(), err)
		}
		m.points = append(m.points, pt)
		if m.s.Progress != nil {
			m.s.Progress(Progress{Level: lv, Done: len(m.points), Planned: planned,
				Elapsed: m.s.Now().Sub(m.start), Budget: m.s.Budget, LastPoint: t.name()})
		}
	}
	return len(ts), nil
}

// timed returns the median and the spread of the samples, in ms.
func stats(samples []time.Duration) (median, spread float64) {
	ms := make([]float64, len(samples))
	for i, d := range samples {
		ms[i] = float64(d) / 1e6
	}
	slices.Sort(ms)
	n := len(ms)
	median = ms[n/2]
	if n%2 == 0 {
		median = (ms[n/2-1] + ms[n/2]) / 2
	}
	if median > 0 {
		spread = (ms[n-1] - ms[0]) / median
	}
	return median, spread
}

func point(t task, samples []time.Duration) perfmodel.Point {
	med, spread := stats(samples)
	return perfmodel.Point{Name: t.name(), Metric: perfmodel.MetricStepMs, Value: max(med, 1e-6),
		Source: "measured", Check: perfmodel.CheckFit, Samples: len(samples), Spread: spread}
}

func (m *measurer) prefill(ctx context.Context, t task) (perfmodel.Point, error) {
	samples := make([]time.Duration, 0, m.s.Repeats)
	for range m.s.Repeats {
		batch := make([]engine.PrefillItem, t.k)
		for i := range batch {
			batch[i] = engine.PrefillItem{Seq: m.id(), Tokens: m.prompt(t.l), Last: true}
		}
		t0 := m.s.Now()
		_, err := m.e.Prefill(ctx, batch, nil)
		samples = append(samples, m.s.Now().Sub(t0))
		for _, it := range batch {
			m.e.Free(it.Seq)
		}
		if err != nil {
			return perfmodel.Point{}, err
		}
	}
	pt := point(t, samples)
	pt.Prefill = make([]int, t.k)
	for i := range pt.Prefill {
		pt.Prefill[i] = t.l
	}
	return pt, nil
}

// ensureLive grows the live set to b sequences at context about n (each
// new one a prefill of n−1 tokens), measuring the KV bytes per token on
// the first one.
func (m *measurer) ensureLive(ctx context.Context, b, n int) error {
	for len(m.live) < b {
		id := m.id()
		out, err := m.e.Prefill(ctx, []engine.PrefillItem{{Seq: id, Tokens: m.prompt(n - 1), Last: true}}, nil)
		if err != nil {
			m.e.Free(id)
			return err
		}
		m.live = append(m.live, id)
		m.tokens[id] = out[0].Token
		if m.kvNote == "" {
			m.measureKV(id)
		}
	}
	return nil
}

// measureKV exports every layer of seq and divides the bytes by its
// tokens.
func (m *measurer) measureKV(seq engine.SeqID) {
	n, err := m.e.Len(seq)
	if err != nil || n == 0 {
		return
	}
	var total int
	var buf []byte
	for l := range m.e.Spec().Layers {
		buf, err = m.e.ExportKV(seq, l, 0, n, buf[:0])
		if err != nil {
			m.kvNote = fmt.Sprintf("the engine exports no KV (%v): the spec's size", err)
			m.kvBytes = int64(m.e.Spec().KVBytesPerToken())
			return
		}
		total += len(buf)
	}
	m.kvBytes = int64(total / n)
	m.kvNote = fmt.Sprintf("exported: %d bytes over %d layers for %d tokens", total, m.e.Spec().Layers, n)
}

// step decodes the first b live sequences once and returns the time and
// the sum of their contexts (the tokens each new token attends to).
func (m *measurer) step(ctx context.Context, b int, pre []engine.PrefillItem) (time.Duration, int, error) {
	items := make([]engine.DecodeItem, b)
	sumN := 0
	for i, id := range m.live[:b] {
		items[i] = engine.DecodeItem{Seq: id, Token: m.tokens[id]}
		n, err := m.e.Len(id)
		if err != nil {
			return 0, 0, err
		}
		sumN += n + 1
	}
	t0 := m.s.Now()
	_, out, err := engine.RunStep(ctx, m.e, pre, items, nil)
	d := m.s.Now().Sub(t0)
	if err != nil {
		return 0, 0, err
	}
	for i, o := range out {
		m.tokens[items[i].Seq] = o.Token
	}
	return d, sumN, nil
}

func (m *measurer) decode(ctx context.Context, t task) (perfmodel.Point, error) {
	if err := m.ensureLive(ctx, t.b, t.n); err != nil {
		return perfmodel.Point{}, err
	}
	if _, _, err := m.step(ctx, t.b, nil); err != nil { // warm-up at this batch shape
		return perfmodel.Point{}, err
	}
	samples := make([]time.Duration, 0, m.s.Repeats)
	sumCtx := 0
	for range m.s.Repeats {
		d, sumN, err := m.step(ctx, t.b, nil)
		if err != nil {
			return perfmodel.Point{}, err
		}
		samples = append(samples, d)
		sumCtx += sumN
	}
	pt := point(t, samples)
	pt.DecodeBatch = t.b
	pt.DecodeContext = int(math.Round(float64(sumCtx) / float64(t.b*m.s.Repeats)))
	return pt, nil
}

func (m *measurer) mixed(ctx context.Context, t task) (perfmodel.Point, error) {
	if err := m.ensureLive(ctx, t.b, t.n); err != nil {
		return perfmodel.Point{}, err
	}
	samples := make([]time.Duration, 0, m.s.Repeats)
	sumCtx := 0
	for range m.s.Repeats {
		id := m.id()
		d, sumN, err := m.step(ctx, t.b, []engine.PrefillItem{{Seq: id, Tokens: m.prompt(t.l), Last: true}})
		m.e.Free(id)
		if err != nil {
			return perfmodel.Point{}, err
		}
		samples = append(samples, d)
		sumCtx += sumN
	}
	pt := point(t, samples)
	pt.Prefill = []int{t.l}
	pt.DecodeBatch = t.b
	pt.DecodeContext = int(math.Round(float64(sumCtx) / float64(t.b*m.s.Repeats)))
	return pt, nil
}

// describeGrid says what the points span and what was left out.
func describeGrid(pts []perfmodel.Point, skipped []string, lim limits) string {
	var nP, nD, nM, maxL, maxB, maxN int
	for _, p := range pts {
		b := p.Batch()
		tokens := 0
		for _, l := range b.Prefill {
			tokens += l
		}
		switch {
		case len(b.Decode) == 0:
			nP++
			maxL = max(maxL, tokens)
		case len(b.Prefill) == 0:
			nD++
			maxB, maxN = max(maxB, len(b.Decode)), max(maxN, p.DecodeContext)
		default:
			nM++
		}
	}
	s := fmt.Sprintf("%d prefill points (up to %d tokens), %d decode points (batch up to %d, context up to %d), %d mixed; limits: %d tokens, batch %d",
		nP, maxL, nD, maxB, maxN, nM, lim.maxTokens, lim.maxBatch)
	if len(skipped) > 0 {
		s += fmt.Sprintf("; left out to fit the budget: %d points (%s)", len(skipped), summarize(skipped))
	}
	return s
}

func summarize(names []string) string {
	const show = 6
	if len(names) <= show {
		return fmt.Sprint(names)
	}
	return fmt.Sprintf("%v … and %d more", names[:show], len(names)-show)
}
