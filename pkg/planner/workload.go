package planner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/pdserve/pdserve/pkg/workload"
)

// Lengths is one request's prompt and output length, in tokens (both ≥ 1
// in a valid workload).
type Lengths struct {
	In  int `json:"in"`
	Out int `json:"out"`
}

// Workload is what the planner plans for: length samples whose empirical
// distribution requests are drawn from, and how requests arrive.
type Workload struct {
	// Description says where the workload came from, for reports.
	Description string
	// Lengths are the samples; requests draw from them with replacement.
	Lengths []Lengths
	// Rate is the source's mean arrival rate, requests/s; 0 when it has
	// none (fixed lengths, ShareGPT).
	Rate float64
	// Burstiness is the shape k of gamma-distributed inter-arrival times
	// (coefficient of variation 1/√k): 1 is Poisson, below 1 burstier,
	// above 1 smoother. 0 means 1. Ignored when Gaps is set.
	Burstiness float64
	// Gaps, when set, are a trace's inter-arrival times in order,
	// normalised to mean 1; the simulator replays a window of them scaled
	// to the planned rate instead of drawing gamma gaps.
	Gaps []float64
	// Notes are adjustments made while loading, for reports.
	Notes []string

	// Blocks, when set, names each sample's prompt blocks (a Mooncake
	// trace's hash_ids, renumbered densely from 0 in order of first
	// appearance): Blocks[i] belongs to Lengths[i], block j covering
	// prompt tokens [j×BlockTokens, (j+1)×BlockTokens). Samples naming
	// the same leading blocks share that prompt prefix, which the
	// simulation's prefix caches reuse (Config.Cache). The simulation
	// replays such a workload's samples in order. Read only.
	Blocks [][]int32
	// BlockTokens is the tokens per block of Blocks (> 0 when Blocks is
	// set).
	BlockTokens int
}

// MooncakeBlockTokens is the tokens per hash block of the Mooncake traces
// (Qin et al., FAST 2025: 512-token blocks).
const MooncakeBlockTokens = 512

// HasBlocks reports whether w names its prompts' blocks.
func (w *Workload) HasBlocks() bool { return len(w.Blocks) > 0 }

// PrefixCeiling is the hit ratio of an infinite cache over one pass of
// w's samples in order: the prompt tokens of full blocks whose id an
// earlier sample named, capped to leave each prompt one token to compute
// (as a worker's cache does), over all prompt tokens. 0 without blocks.
func (w *Workload) PrefixCeiling() float64 {
	if !w.HasBlocks() {
		return 0
	}
	seen := map[int32]bool{}
	var hit, all int64
	for i, l := range w.Lengths {
		blocks := fullBlocks(w.Blocks[i], l.In, w.BlockTokens)
		n := 0
		for n < len(blocks) && seen[blocks[n]] {
			n++
		}
		hit += int64(hitTokens(n, l.In, w.BlockTokens))
		all += int64(l.In)
		for _, b := range blocks {
			seen[b] = true
		}
	}
	return float64(hit) / float64(all)
}

// fullBlocks is the leading blocks of ids that a prompt of in tokens
// fills completely.
func fullBlocks(ids []int32, in, blockTokens int) []int32 {
	return ids[:min(len(ids), in/blockTokens)]
}

// hitTokens is the prompt tokens n leading cached blocks save a prompt of
// in tokens: whole blocks, leaving at least one token to compute.
func hitTokens(n, in, blockTokens int) int {
	return min(n*blockTokens, max(in-1, 0))
}

// AzureAttribution is the citation the Azure LLM inference trace's licence
// (CC-BY 4.0) asks for wherever results built on it are shown.
const AzureAttribution = "Azure LLM inference trace 2023 (CC-BY 4.0): Patel et al., Splitwise: Efficient generative LLM inference using phase splitting, ISCA 2024"

// ErrWorkload reports a workload that cannot be read or used; match with
// errors.Is.
var ErrWorkload = errors.New("planner: bad workload")

// Validate reports an empty workload, lengths < 1, a negative or
// non-finite rate, burstiness or gap, or Blocks that do not match the
// samples (one list per sample, ids ≥ 0, BlockTokens > 0).
func (w *Workload) Validate() error {
	if len(w.Lengths) == 0 {
		return fmt.Errorf("%w: no length samples", ErrWorkload)
	}
	if w.HasBlocks() {
		if len(w.Blocks) != len(w.Lengths) || w.BlockTokens < 1 {
			return fmt.Errorf("%w: %d block lists of %d tokens per block for %d samples, want one per sample and ≥ 1 token", ErrWorkload, len(w.Blocks), w.BlockTokens, len(w.Lengths))
		}
		for i, bs := range w.Blocks {
			for _, b := range bs {
				if b < 0 {
					return fmt.Errorf("%w: sample %d names block %d < 0", ErrWorkload, i, b)
				}
			}
		}
	}
	for i, l := range w.Lengths {
		if l.In < 1 || l.Out < 1 {
			return fmt.Errorf("%w: sample %d has lengths %d/%d, want ≥ 1", ErrWorkload, i, l.In, l.Out)
		}
	}
	if !finiteNonNeg(w.Rate) || !finiteNonNeg(w.Burstiness) {
		return fmt.Errorf("%w: rate %v and burstiness %v must be finite and ≥ 0", ErrWorkload, w.Rate, w.Burstiness)
	}
	for i, g := range w.Gaps {
		if !finiteNonNeg(g) {
			return fmt.Errorf("%w: gap %d is %v", ErrWorkload, i, g)
		}
	}
	return nil
}

func finiteNonNeg(x float64) bool { return x >= 0 && !math.IsInf(x, 0) }

// LengthStats summarises a workload's lengths, tokens.
type LengthStats struct {
	Samples  int     `json:"samples"`
	MeanIn   float64 `json:"mean_in"`
	MeanOut  float64 `json:"mean_out"`
	P50In    int     `json:"p50_in"`
	P99In    int     `json:"p99_in"`
	P50Out   int     `json:"p50_out"`
	P99Out   int     `json:"p99_out"`
	MaxTotal int     `json:"max_total"` // largest In+Out
}

// Stats returns the workload's length statistics.
func (w *Workload) Stats() LengthStats {
	n := len(w.Lengths)
	s := LengthStats{Samples: n}
	if n == 0 {
		return s
	}
	ins, outs := make([]int, n), make([]int, n)
	for i, l := range w.Lengths {
		ins[i], outs[i] = l.In, l.Out
		s.MeanIn += float64(l.In)
		s.MeanOut += float64(l.Out)
		s.MaxTotal = max(s.MaxTotal, l.In+l.Out)
	}
	s.MeanIn /= float64(n)
	s.MeanOut /= float64(n)
	slices.Sort(ins)
	slices.Sort(outs)
	s.P50In, s.P99In = ins[pctIndex(n, 0.5)], ins[pctIndex(n, 0.99)]
	s.P50Out, s.P99Out = outs[pctIndex(n, 0.5)], outs[pctIndex(n, 0.99)]
	return s
}

// pctIndex is the nearest-rank index of quantile q in a sorted slice of n.
func pctIndex(n int, q float64) int {
	i := int(math.Ceil(q*float64(n))) - 1
	return min(max(i, 0), n-1)
}

// Fixed returns a workload whose every request has in prompt and out output
// tokens.
func Fixed(in, out int) *Workload {
	return &Workload{Description: fmt.Sprintf("fixed %d in / %d out", in, out), Lengths: []Lengths{{in, out}}}
}

// LoadOptions tune LoadWorkload.
type LoadOptions struct {
	// Samples is how many ShareGPT conversations to sample (vLLM's
	// filters and tokenizer approximation, see pkg/workload); ≤ 0
	// means 10000.
	Samples int
	// Seed makes sampling repeatable.
	Seed uint64
}

// LoadWorkload reads the workload spec names:
//
//	fixed:IN/OUT      every request IN prompt and OUT output tokens
//	FILE.csv          an Azure LLM inference trace (lengths, rate, gaps)
//	FILE.jsonl        a Mooncake trace (lengths, rate, gaps)
//	FILE.json         a ShareGPT file (a JSON list; lengths only) or a
//	                  loadtest result (a JSON object; per-request lengths
//	                  when saved detailed, else the mean lengths, and the
//	                  run's rate and burstiness)
//
// The trace parsers are the load generator's (pkg/workload). Errors
// wrap ErrWorkload, or the file's read error.
func LoadWorkload(spec string, o LoadOptions) (*Workload, error) {
	if rest, ok := strings.CutPrefix(spec, "fixed:"); ok {
		a, b, ok := strings.Cut(rest, "/")
		in, err1 := strconv.Atoi(a)
		out, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || in < 1 || out < 1 {
			return nil, fmt.Errorf("%w: %q: want fixed:IN/OUT with integers ≥ 1", ErrWorkload, spec)
		}
		return Fixed(in, out), nil
	}
	if !strings.HasSuffix(spec, ".csv") && !strings.HasSuffix(spec, ".jsonl") && !strings.HasSuffix(spec, ".json") {
		return nil, fmt.Errorf("%w: %q: want fixed:IN/OUT or a .csv, .jsonl or .json file", ErrWorkload, spec)
	}
	data, err := os.ReadFile(spec)
	if err != nil {
		return nil, fmt.Errorf("planner: read workload: %w", err)
	}
	var w *Workload
	switch {
	case strings.HasSuffix(spec, ".csv"):
		w, err = traceWorkload("azure", data)
	case strings.HasSuffix(spec, ".jsonl"):
		w, err = traceWorkload("mooncake", data)
	default:
		switch t := bytes.TrimSpace(data); {
		case len(t) > 0 && t[0] == '[':
			w, err = shareGPTWorkload(data, o)
		case len(t) > 0 && t[0] == '{':
			w, err = resultWorkload(data)
		default:
			err = fmt.Errorf("%w: %s: neither a ShareGPT list nor a loadtest result object", ErrWorkload, spec)
		}
	}
	if err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", spec, err)
	}
	return w, nil
}

func traceWorkload(kind string, data []byte) (*Workload, error) {
	rows, err := parseTrace(kind, data)
	if err != nil {
		return nil, err
	}
	return rowsWorkload(kind, rows), nil
}

// parseTrace parses an Azure ("azure") or a Mooncake trace. Errors wrap
// ErrWorkload.
func parseTrace(kind string, data []byte) ([]workload.TraceRow, error) {
	var rows []workload.TraceRow
	var err error
	if kind == "azure" {
		rows, err = workload.ParseAzure(bytes.NewReader(data))
	} else {
		rows, err = workload.ParseMooncake(bytes.NewReader(data))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrWorkload, err)
	}
	return rows, nil
}

// rowsWorkload is the workload of trace rows (≥ 1), arrivals counted
// from the first row's.
func rowsWorkload(kind string, rows []workload.TraceRow) *Workload {
	w := &Workload{Lengths: make([]Lengths, len(rows))}
	zero := 0
	for i, r := range rows {
		out := r.OutputLen
		if out < 1 {
			out, zero = 1, zero+1
		}
		w.Lengths[i] = Lengths{In: r.InputLen, Out: out}
	}
	if zero > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("%s: %d rows with 0 output tokens count as 1", kind, zero))
	}
	if slices.ContainsFunc(rows, func(r workload.TraceRow) bool { return len(r.HashIDs) > 0 }) {
		ids := map[int64]int32{}
		w.Blocks, w.BlockTokens = make([][]int32, len(rows)), MooncakeBlockTokens
		for i, r := range rows {
			w.Blocks[i] = make([]int32, len(r.HashIDs))
			for j, h := range r.HashIDs {
				id, ok := ids[h]
				if !ok {
					id = int32(len(ids))
					ids[h] = id
				}
				w.Blocks[i][j] = id
			}
		}
	}
	span := (rows[len(rows)-1].Arrival - rows[0].Arrival).Seconds()
	if len(rows) > 1 && span > 0 {
		w.Rate = float64(len(rows)-1) / span
		gaps := make([]float64, len(rows)-1)
		for i := 1; i < len(rows); i++ {
			gaps[i-1] = (rows[i].Arrival - rows[i-1].Arrival).Seconds()
		}
		w.Gaps = normalizeGaps(gaps)
		w.Burstiness = burstinessOf(w.Gaps)
	}
	w.Description = fmt.Sprintf("%s trace: %d requests, %.2f req/s, inter-arrival CV %.2f", kind, len(rows), w.Rate, cvOf(w.Gaps))
	if w.HasBlocks() {
		w.Description += fmt.Sprintf(", %d-token hash blocks (infinite-cache hit ratio %.3f)", w.BlockTokens, w.PrefixCeiling())
	}
	if kind == "azure" {
		w.Notes = append(w.Notes, AzureAttribution)
	}
	return w
}

// normalizeGaps returns gaps divided by their mean (nil when the mean is 0).
func normalizeGaps(gaps []float64) []float64 {
	var sum float64
	for _, g := range gaps {
		sum += g
	}
	if !(sum > 0) {
		return nil
	}
	mean := sum / float64(len(gaps))
	out := make([]float64, len(gaps))
	for i, g := range gaps {
		out[i] = g / mean
	}
	return out
}

// cvOf is the coefficient of variation of xs (0 for fewer than 2 values).
func cvOf(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	var sum, sq float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	for _, x := range xs {
		sq += (x - mean) * (x - mean)
	}
	if mean == 0 {
		return 0
	}
	return math.Sqrt(sq/float64(len(xs)-1)) / mean
}

// burstinessOf is the gamma shape 1/CV² matching gaps, clamped to
// [0.01, 100]; 1 when it cannot be estimated.
func burstinessOf(gaps []float64) float64 {
	cv := cvOf(gaps)
	if cv == 0 {
		return 1
	}
	return min(max(1/(cv*cv), 0.01), 100)
}

func shareGPTWorkload(data []byte, o LoadOptions) (*Workload, error) {
	convs, err := workload.ParseShareGPT(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrWorkload, err)
	}
	n := o.Samples
	if n <= 0 {
		n = 10000
	}
	wl, err := workload.ShareGPT(convs, workload.ShareGPTOptions{}, n, o.Seed, workload.Synth{Tokenizer: workload.Approx})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrWorkload, err)
	}
	w := &Workload{
		Description: fmt.Sprintf("%s, %d samples, ~4 bytes per token", wl.Description, len(wl.Requests)),
		Lengths:     make([]Lengths, len(wl.Requests)),
		Notes:       wl.Notes,
	}
	for i, r := range wl.Requests {
		w.Lengths[i] = Lengths{In: r.PromptLen, Out: r.OutputLen}
	}
	return w, nil
}

// loadtestResult holds the fields of a loadtest (vLLM-compatible) result
// JSON the planner reads.
type loadtestResult struct {
	Completed         int             `json:"completed"`
	Duration          float64         `json:"duration"`
	TotalInputTokens  int             `json:"total_input_tokens"`
	TotalOutputTokens int             `json:"total_output_tokens"`
	RequestRate       json.RawMessage `json:"request_rate"`
	Burstiness        float64         `json:"burstiness"`
	InputLens         []int           `json:"input_lens"`
	OutputLens        []int           `json:"output_lens"`
	StartTimes        []float64       `json:"start_times"`
	Workload          string          `json:"workload"`
}

func resultWorkload(data []byte) (*Workload, error) {
	var r loadtestResult
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: loadtest result: %v", ErrWorkload, err)
	}
	if r.Completed < 1 {
		return nil, fmt.Errorf("%w: loadtest result has no completed request", ErrWorkload)
	}
	w := &Workload{Burstiness: r.Burstiness}
	if len(r.InputLens) > 0 && len(r.InputLens) == len(r.OutputLens) {
		for i, in := range r.InputLens {
			if in >= 1 && r.OutputLens[i] >= 1 { // failed requests have 0 output
				w.Lengths = append(w.Lengths, Lengths{In: in, Out: r.OutputLens[i]})
			}
		}
	}
	if len(w.Lengths) == 0 {
		in := max(int(math.Round(float64(r.TotalInputTokens)/float64(r.Completed))), 1)
		out := max(int(math.Round(float64(r.TotalOutputTokens)/float64(r.Completed))), 1)
		w.Lengths = []Lengths{{in, out}}
		w.Notes = append(w.Notes, "loadtest result without per-request lengths (run with --save-detailed): planning with the mean lengths")
	}
	var rate float64
	if err := json.Unmarshal(r.RequestRate, &rate); err != nil || !(rate > 0) || math.IsInf(rate, 0) {
		rate = 0
		if r.Duration > 0 {
			rate = float64(r.Completed) / r.Duration
		}
	}
	w.Rate = rate
	w.Description = fmt.Sprintf("loadtest result: %d requests at %.2f req/s (%s)", r.Completed, rate, r.Workload)
	if ts := slices.Sorted(slices.Values(r.StartTimes)); len(ts) > 2 && ts[len(ts)-1] > ts[0] {
		// The run's own arrivals (loadtest --save-detailed): replayed in
		// order, scaled to the planned rate.
		gaps := make([]float64, len(ts)-1)
		for i := range gaps {
			gaps[i] = ts[i+1] - ts[i]
		}
		w.Gaps = normalizeGaps(gaps)
		w.Burstiness = burstinessOf(w.Gaps)
		w.Rate = float64(len(gaps)) / (ts[len(ts)-1] - ts[0])
		w.Description += fmt.Sprintf(", its %d arrivals at %.3g req/s, inter-arrival CV %.2f", len(ts), w.Rate, cvOf(w.Gaps))
	}
	return w, nil
}
