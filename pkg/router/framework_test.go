package router

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pdserve/pdserve/pkg/router/plugins/draining"
)

// fixedScorer scores workers from a table by id (missing: 0) and counts
// its calls.
type fixedScorer struct {
	name   string
	scores map[string]float64
	calls  int
}

func (s *fixedScorer) Name() string { return s.name }
func (s *fixedScorer) Score(_ *Input, cs []Candidate, out []float64) {
	s.calls++
	for i, c := range cs {
		out[i] = s.scores[c.Worker.ID]
	}
}

// funcFilter is a filter from a function.
type funcFilter struct {
	name string
	keep func(Candidate) bool
}

func (f *funcFilter) Name() string { return f.name }
func (f *funcFilter) Filter(_ *Input, cs []Candidate) []Candidate {
	var out []Candidate
	for _, c := range cs {
		if f.keep(c) {
			out = append(out, c)
		}
	}
	return out
}

var (
	_ Scorer = (*fixedScorer)(nil)
	_ Filter = (*funcFilter)(nil)
)

func TestProfileWeightsAndTies(t *testing.T) {
	a := map[string]float64{"w0": 1, "w1": 0, "w2": 0.5}
	b := map[string]float64{"w0": 0, "w1": 1, "w2": 0.5}
	workers := []Worker{{ID: "w2"}, {ID: "w1"}, {ID: "w0"}}
	tests := []struct {
		name   string
		wa, wb float64
		sa, sb map[string]float64
		want   string
	}{
		{name: "a alone", wa: 1, sa: a, sb: b, want: "w0"},
		{name: "b alone", wb: 1, sa: a, sb: b, want: "w1"},
		{name: "b heavier", wa: 1, wb: 2, sa: a, sb: b, want: "w1"},
		{name: "equal weights: three-way tie, lowest id", wa: 1, wb: 1, sa: a, sb: b, want: "w0"},
		{name: "no scorer: lowest id", sa: a, sb: b, want: "w0"},
		{name: "out-of-range scores are clamped", wa: 1, wb: 1, want: "w2",
			sa: map[string]float64{"w0": 7, "w1": math.NaN(), "w2": 1},
			sb: map[string]float64{"w0": -3, "w1": 0.5, "w2": 0.5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sa, sb := &fixedScorer{name: "a", scores: tc.sa}, &fixedScorer{name: "b", scores: tc.sb}
			p := &Profile{Scorers: []WeightedScorer{{sa, tc.wa}, {sb, tc.wb}}}
			d, err := New(Config{Colocated: true, DecodeProfile: p}).Route(at(0), Request{ID: "r", PromptTokens: 1}, workers, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d.Decode.ID != tc.want {
				t.Errorf("picked %s, want %s", d.Decode.ID, tc.want)
			}
			if tc.wa == 0 && sa.calls != 0 || tc.wb == 0 && sb.calls != 0 {
				t.Errorf("a scorer of weight 0 ran (calls a %d, b %d)", sa.calls, sb.calls)
			}
		})
	}
}

func TestFiltersEmptyingTheSet(t *testing.T) {
	none := &funcFilter{name: "none", keep: func(Candidate) bool { return false }}
	decode := []Worker{{ID: "d0", KVBlocksFree: 10}}
	prefill := []Worker{{ID: "p0"}}
	tests := []struct {
		name             string
		decode, prefill  *Profile
		wantErr, wantMsg string
	}{
		{name: "decode eligibility", decode: &Profile{Filters: []Filter{none}}, wantErr: "ErrNoDecodeWorkers", wantMsg: "filter none left none"},
		{name: "decode capacity", decode: &Profile{Capacity: []Filter{none}}, wantErr: "ErrNoCapacity", wantMsg: "decode filter none"},
		{name: "prefill eligibility", prefill: &Profile{Filters: []Filter{none}}, wantErr: "ErrNoPrefillWorkers", wantMsg: "filter none left none"},
		{name: "prefill capacity", prefill: &Profile{Capacity: []Filter{none}}, wantErr: "ErrNoCapacity", wantMsg: "prefill filter none"},
	}
	errs := map[string]error{"ErrNoDecodeWorkers": ErrNoDecodeWorkers, "ErrNoPrefillWorkers": ErrNoPrefillWorkers, "ErrNoCapacity": ErrNoCapacity}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Config{DecodeProfile: tc.decode, PrefillProfile: tc.prefill})
			_, err := r.Route(at(0), Request{ID: "r", PromptTokens: 10}, decode, prefill, nil)
			if !errors.Is(err, errs[tc.wantErr]) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("Route error = %v, want %s saying %q", err, tc.wantErr, tc.wantMsg)
			}
			if r.InFlight() != 0 {
				t.Errorf("failed Route left %d assignments", r.InFlight())
			}
		})
	}
}

// Default profiles: the plugins as configured by weights.
func TestDefaultProfiles(t *testing.T) {
	hashes := []uint64{1, 2, 3, 4}
	tests := []struct {
		name    string
		cfg     Config
		req     Request
		decode  []Worker
		prefill []Worker
		want    choice
	}{
		{
			name:   "free share, not count, by default",
			cfg:    Config{Colocated: true},
			decode: []Worker{{ID: "big", KVBlocksFree: 300, KVBlocksTotal: 1000}, {ID: "small", KVBlocksFree: 60, KVBlocksTotal: 100}},
			want:   choice{Decode: "small", Local: true},
		},
		{
			name: "decode prefix weight prefers the worker holding the prefix",
			cfg:  Config{Colocated: true, Decode: Weights{Prefix: 1, KV: 1}},
			req:  Request{ID: "r", PromptTokens: 64, PrefixHashes: hashes},
			decode: []Worker{{ID: "d0", KVBlocksFree: 100, KVBlocksTotal: 100},
				{ID: "d1", KVBlocksFree: 80, KVBlocksTotal: 100, PrefixDigest: []uint64{1, 2, 3}}},
			want: choice{Decode: "d1", Local: true, Hit: 48},
		},
		{
			name: "no KV room: skipped even when it scores best",
			cfg:  Config{Colocated: true, Decode: Weights{Batch: 1}},
			req:  Request{ID: "r", PromptTokens: 64},
			decode: []Worker{{ID: "d0", KVBlocksFree: 3, KVBlocksTotal: 100},
				{ID: "d1", KVBlocksFree: 40, KVBlocksTotal: 100, RunningBatch: 8}},
			want: choice{Decode: "d1", Local: true},
		},
		{
			name:   "prefill batch weight",
			cfg:    Config{Prefill: Weights{Batch: 1}},
			req:    Request{ID: "r", PromptTokens: 64},
			decode: []Worker{{ID: "d0", KVBlocksFree: 100}},
			prefill: []Worker{{ID: "p0", RunningBatch: 4},
				{ID: "p1", RunningBatch: 1, QueuedPrefillTokens: 5000}},
			want: choice{Decode: "d0", Prefill: "p1"},
		},
		{
			name:    "prefill hit is predicted without a prefix weight",
			req:     Request{ID: "r", PromptTokens: 64, PrefixHashes: hashes},
			decode:  []Worker{{ID: "d0", KVBlocksFree: 100}},
			prefill: []Worker{{ID: "p0", PrefixDigest: []uint64{9, 1, 2}}},
			want:    choice{Decode: "d0", Prefill: "p0", Hit: 32},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			if req.ID == "" {
				req = Request{ID: "r", PromptTokens: 64}
			}
			d, err := New(tc.cfg).Route(at(0), req, tc.decode, tc.prefill, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, summarise(d)); diff != "" {
				t.Errorf("Route (-want +got):\n%s", diff)
			}
		})
	}
}

// fakeClock advances by step at every read.
type fakeClock struct {
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time { c.t = c.t.Add(c.step); return c.t }

func TestPluginTimingMetric(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	clk := &fakeClock{t: t0, step: 3 * time.Microsecond}
	score := &fixedScorer{name: "fixed", scores: map[string]float64{"d1": 1}}
	r := New(Config{Colocated: true, Registerer: reg, Clock: clk.now,
		DecodeProfile: &Profile{Filters: []Filter{&draining.Filter{}}, Scorers: []WeightedScorer{{score, 1}}}})
	decode := []Worker{{ID: "d0"}, {ID: "d1"}}
	for _, id := range []string{"a", "b"} {
		if _, err := r.Route(at(0), Request{ID: id, PromptTokens: 1}, decode, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Each call took one clock step, 3µs: in the 4µs bucket.
	want := `
# HELP pdserve_router_plugin_duration_seconds Time of one call of a router plugin (filter, scorer or picker), by profile (decode, prefill).
# TYPE pdserve_router_plugin_duration_seconds histogram
`
	for _, p := range []struct{ kind, plugin string }{{"filter", "draining"}, {"picker", "maxscore"}, {"scorer", "fixed"}} {
		want += histogram(`kind="`+p.kind+`",plugin="`+p.plugin+`",profile="decode"`, 2, 2*3e-6)
	}
	want += `# HELP pdserve_router_decisions_total Requests routed, by where their prompt prefills: remote, local_short (few uncached tokens), local_busy (prefill pool busy), local_reserved (few uncached tokens by the decode worker's Reserve, routed remote on the estimate), local (colocated or required), decode_only (recovery).
# TYPE pdserve_router_decisions_total counter
pdserve_router_decisions_total{placement="local"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}

	// A second router on the same registry shares the collectors.
	New(Config{Registerer: reg})
	// The default profiles: one series per plugin that runs (scorers of
	// weight 0 do not): decode 4+2 filters, prefix, kv and batch, the
	// picker; prefill 4+1 filters, prefix, queue, the picker. Least-loaded
	// runs no prefix scorer.
	for _, tc := range []struct {
		name string
		cfg  Config
		want int
	}{
		{"default", Config{}, 10 + 8},
		{"least-loaded", Config{Decode: LeastLoadedDecodeWeights, Prefill: LeastLoadedPrefillWeights}, 9 + 7},
	} {
		tc.cfg.Registerer = prometheus.NewRegistry()
		r2 := New(tc.cfg)
		if _, err := r2.Route(at(0), Request{ID: "x", PromptTokens: 1}, []Worker{{ID: "d0", KVBlocksFree: 9}}, []Worker{{ID: "p0"}}, nil); err != nil {
			t.Fatal(err)
		}
		if n := testutil.CollectAndCount(r2.timer.hist); n != tc.want {
			t.Errorf("%s profiles: %d timed plugins, want %d", tc.name, n, tc.want)
		}
	}
}

// histogram is the text form of one series of the timing histogram,
// with every observation in the 4µs bucket.
func histogram(labels string, n int, sum float64) string {
	var b strings.Builder
	for _, le := range []string{"1e-06", "4e-06", "1.6e-05", "6.4e-05", "0.000256", "0.001024", "0.004096", "0.016384", "+Inf"} {
		c := n
		if le == "1e-06" {
			c = 0
		}
		b.WriteString("pdserve_router_plugin_duration_seconds_bucket{" + labels + `,le="` + le + `"} ` + itoa(c) + "\n")
	}
	b.WriteString("pdserve_router_plugin_duration_seconds_sum{" + labels + "} " + ftoa(sum) + "\n")
	b.WriteString("pdserve_router_plugin_duration_seconds_count{" + labels + "} " + itoa(n) + "\n")
	return b.String()
}

func itoa(n int) string     { return strconv.Itoa(n) }
func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
