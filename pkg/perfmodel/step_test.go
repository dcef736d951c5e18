package perfmodel

import (
	"errors"
	"math"
	"testing"
	"time"
)

// synthetic is a roofline profile with round numbers, so expected step
// times can be worked out by hand: 1e9 body parameters, a 1e6-parameter
// LM head, 40,000 KV bytes per token, overlap 1 (compute and weight reads
// add up), TP 1.
func synthetic() *Profile {
	return &Profile{
		Name: "test/synthetic/tp1", GPU: "test", Model: "synthetic", TP: 1,
		Hardware: GPUSpec{BF16FLOPS: 1e15, HBMBytesPerSec: 1e12, MemoryBytes: 80e9, LinkBytesPerSec: 1e11},
		Spec: ModelShape{
			Params: 1e9 + 2e6, Layers: 10, Hidden: 1000, Heads: 8, KVHeads: 8, HeadDim: 125,
			Intermediate: 4000, Vocab: 1000, MaxSeqLen: 8192,
		},
		Form: FormRoofline,
		Roofline: &Roofline{
			ComputeEfficiency: 0.5, AttentionEfficiency: 0.25, MemoryEfficiency: 0.5, Overlap: 1,
			StepOverheadMs: 1, SeqOverheadMs: 0.1,
		},
		Memory:    Memory{Utilization: 0.9, ReserveBytesPerGPU: 1e9},
		Source:    "test",
		Tolerance: 0.15,
	}
}

func decodeBatch(n, ctx int) []int {
	d := make([]int, n)
	for i := range d {
		d[i] = ctx
	}
	return d
}

func relClose(got, want float64) bool { return math.Abs(got-want) <= 1e-12*math.Abs(want) }

func TestSyntheticProfileIsValid(t *testing.T) {
	if err := synthetic().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestRooflineStepByHand(t *testing.T) {
	p := synthetic()
	// Decode 4 sequences at context 1000:
	//   GEMM   2·(1e9·4 + 1e6·4)/(1e15·0.5) + 2·(1e9+1e6)/(1e12·0.5)
	//   attn   max(4·8·125·10·4000/(1e15·0.25), 4000·40000/(1e12·0.5)) = 3.2e-4
	//   over   1e-3 + 4·1e-4
	decode := 2*(1e9*4+1e6*4)/5e14 + 2*(1e9+1e6)/5e11 + 3.2e-4 + 1e-3 + 4e-4
	// A 2048-token chunk with nothing cached adds
	//   GEMM   2·(1e9·2048 + 1e6)/(1e15·0.5)          (weights already read)
	//   attn   max(40000·2048·2049/2/(2.5e14), 2048·40000/5e11)
	//   over   1e-4
	chunk := 2*(1e9*2048+1e6)/5e14 + math.Max(40000*2048*2049/2/2.5e14, 2048*40000/5e11) + 1e-4

	tests := []struct {
		name  string
		batch Batch
		want  float64
	}{
		{"empty", Batch{}, 0},
		{"decode 4 at 1000", Batch{Decode: decodeBatch(4, 1000)}, decode},
		{"decode 4 + chunk 2048", Batch{Prefill: []int{2048}, Decode: decodeBatch(4, 1000)}, decode + chunk},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.StepSeconds(tc.batch); !relClose(got, tc.want) {
				t.Errorf("StepSeconds = %.12g, want %.12g", got, tc.want)
			}
		})
	}
}

// TestInterference: a decode step that also carries a 2k-token prefill
// chunk costs more than the decode step alone, by the amount the model
// predicts.
func TestInterference(t *testing.T) {
	decode := decodeBatch(32, 1024)
	t.Run("distserve", func(t *testing.T) {
		p := mustLoad(t, "a100-80g/opt-13b/tp1")
		d := p.DistServe
		for _, cached := range []int{0, 1024} {
			alone := p.StepSeconds(Batch{Decode: decode})
			mixed := p.StepSeconds(Batch{Prefill: []int{2048}, PrefillContext: []int{cached}, Decode: decode})
			// One fixed cost (the larger intercept) plus the chunk's
			// linear and attention terms: (c+l)² − c².
			l, c := 2048.0, float64(cached)
			want := (math.Max(d.Prefill[0], d.DecodeSmall[0]) - d.DecodeSmall[0] + d.Prefill[1]*l + d.Prefill[2]*((c+l)*(c+l)-c*c)) / 1e3
			if got := mixed - alone; !relClose(got, want) || !(got > 0) {
				t.Errorf("cached %d: mixed − decode = %.9g s, want %.9g s", cached, got, want)
			}
		}
	})
	t.Run("roofline by hand", func(t *testing.T) {
		p := synthetic()
		alone := p.StepSeconds(Batch{Decode: decodeBatch(4, 1000)})
		mixed := p.StepSeconds(Batch{Prefill: []int{2048}, Decode: decodeBatch(4, 1000)})
		want := 2*(1e9*2048+1e6)/5e14 + math.Max(40000*2048*2049/2/2.5e14, 2048*40000/5e11) + 1e-4
		if got := mixed - alone; !relClose(got, want) {
			t.Errorf("mixed − decode = %.12g s, want %.12g s", got, want)
		}
	})
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p := mustLoad(t, name)
			chunk := min(2048, p.Spec.MaxSeqLen-1024)
			alone := p.StepTime(Batch{Decode: decode})
			prefill := p.StepTime(Batch{Prefill: []int{chunk}})
			mixed := p.StepTime(Batch{Prefill: []int{chunk}, Decode: decode})
			if mixed <= alone || mixed <= prefill {
				t.Errorf("mixed %v must exceed decode alone %v and prefill alone %v", mixed, alone, prefill)
			}
			if mixed >= alone+prefill {
				t.Errorf("mixed %v must cost less than decode %v + prefill %v run apart (one weight read, one fixed cost)", mixed, alone, prefill)
			}
		})
	}
}

func TestChunkedPrefillAddsUpToTheWholePrompt(t *testing.T) {
	chunks := []int{512, 1024, 256, 256}
	whole := 0
	for _, l := range chunks {
		whole += l
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p := mustLoad(t, name)
			var sum float64
			cached := 0
			for _, l := range chunks {
				sum += p.StepSeconds(Batch{Prefill: []int{l}, PrefillContext: []int{cached}})
				cached += l
			}
			one := p.StepSeconds(Batch{Prefill: []int{whole}})
			if p.Form == FormDistServe {
				// Attention terms telescope to whole²; each extra chunk
				// pays the intercept once more.
				want := one + float64(len(chunks)-1)*p.DistServe.Prefill[0]/1e3
				if !relClose(sum, want) {
					t.Errorf("chunked %.9g s, want whole + 3 intercepts = %.9g s", sum, want)
				}
				return
			}
			if sum <= one {
				t.Errorf("chunked %.6g s ≤ whole %.6g s: chunks re-read weights and must cost more", sum, one)
			}
		})
	}
}

func TestStepTimeGrowsWithWork(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p := mustLoad(t, name)
			prev := time.Duration(0)
			for _, l := range []int{1, 16, 128, 512, 1024, 2048} {
				got := p.PrefillTime([]int{l})
				if got <= prev {
					t.Errorf("prefill %d = %v, not above the shorter prompt's %v", l, got, prev)
				}
				prev = got
			}
			prev = 0
			for _, c := range []int{0, 128, 1024} {
				got := p.StepTime(Batch{Prefill: []int{256}, PrefillContext: []int{c}})
				if got < prev {
					t.Errorf("chunk after %d cached = %v, below %v", c, got, prev)
				}
				prev = got
			}
			prev = 0
			// Below DistServe's large-batch threshold (its two fits are not
			// continuous across it).
			for _, n := range []int{1, 2, 8, 32, 64, 94} {
				got := p.DecodeTime(decodeBatch(n, 512))
				if got <= prev {
					t.Errorf("decode %d = %v, not above %v", n, got, prev)
				}
				prev = got
			}
			if a, b := p.DecodeTime(decodeBatch(8, 256)), p.DecodeTime(decodeBatch(8, 2000)); b <= a {
				t.Errorf("decode at longer context %v ≤ shorter %v", b, a)
			}
		})
	}
}

func TestStepTimeConvenienceForms(t *testing.T) {
	p := mustLoad(t, "h100/llama-3-8b/tp1")
	if got, want := p.PrefillTime([]int{100, 200}), p.StepTime(Batch{Prefill: []int{100, 200}}); got != want {
		t.Errorf("PrefillTime = %v, StepTime = %v", got, want)
	}
	if got, want := p.DecodeTime([]int{100, 200}), p.StepTime(Batch{Decode: []int{100, 200}}); got != want {
		t.Errorf("DecodeTime = %v, StepTime = %v", got, want)
	}
	if got := p.StepTime(Batch{}); got != 0 {
		t.Errorf("empty batch = %v, want 0", got)
	}
	// Negative lengths count as 0 instead of producing a negative time.
	if got, want := p.StepTime(Batch{Prefill: []int{-5}, Decode: []int{-1}}), p.StepTime(Batch{Prefill: []int{0}, Decode: []int{0}}); got != want || got < 0 {
		t.Errorf("negative lengths: %v, want %v", got, want)
	}
}

func TestBatchValidate(t *testing.T) {
	tests := []struct {
		name string
		b    Batch
		ok   bool
	}{
		{"empty", Batch{}, true},
		{"mixed", Batch{Prefill: []int{5}, PrefillContext: []int{3}, Decode: []int{7}}, true},
		{"nil context", Batch{Prefill: []int{5, 6}}, true},
		{"context length", Batch{Prefill: []int{5, 6}, PrefillContext: []int{1}}, false},
		{"negative chunk", Batch{Prefill: []int{-1}}, false},
		{"negative context", Batch{Prefill: []int{1}, PrefillContext: []int{-1}}, false},
		{"negative decode", Batch{Decode: []int{-1}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.b.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestSmoothMax(t *testing.T) {
	tests := []struct{ a, b, p, want float64 }{
		{3, 4, 1, 7},
		{3, 4, 2, 5},
		{0, 0, 2, 0},
		{0, 5, 1.5, 5},
		{1e300, 1e300, 2, 1e300 * math.Sqrt2},
		{3, 4, 200, 4},
	}
	for _, tc := range tests {
		if got := smoothMax(tc.a, tc.b, tc.p); math.Abs(got-tc.want) > 1e-9*tc.want {
			t.Errorf("smoothMax(%v, %v, %v) = %v, want %v", tc.a, tc.b, tc.p, got, tc.want)
		}
	}
}

func TestMemory(t *testing.T) {
	p := synthetic()
	// Per GPU: 80e9·0.9 − 2·(1e9+2e6) weights − 1e9 reserve = 68.996e9 bytes,
	// 40,000 bytes per token.
	if got, want := p.KVCapacityBytes(), 80e9*0.9-2*(1e9+2e6)-1e9; got != want {
		t.Errorf("KVCapacityBytes = %v, want %v", got, want)
	}
	if got, want := p.MaxKVTokens(), int64(1724900); got != want {
		t.Errorf("MaxKVTokens = %d, want %d", got, want)
	}
	if got, want := p.MaxKVBlocks(16), int64(1724900/16); got != want {
		t.Errorf("MaxKVBlocks(16) = %d, want %d", got, want)
	}
	if got := p.MaxKVBlocks(0); got != 0 {
		t.Errorf("MaxKVBlocks(0) = %d, want 0", got)
	}
	huge := synthetic()
	huge.Spec.Params = 1e12
	if got := huge.MaxKVTokens(); got != 0 {
		t.Errorf("MaxKVTokens of a model larger than memory = %d, want 0", got)
	}
	// KV heads replicate when TP exceeds them: Llama-3-8B (8 KV heads) at
	// TP 16 stores two heads' worth per token per pair of GPUs.
	l := mustLoad(t, "h100/llama-3-8b/tp1")
	if got, want := l.kvBytesPerTokenPerGPU(), float64(l.KVBytesPerToken()); got != want {
		t.Errorf("TP1 per-GPU KV = %v, want %v", got, want)
	}
	l.TP = 16
	if got, want := l.kvBytesPerTokenPerGPU()*16, float64(2*l.KVBytesPerToken()); got != want {
		t.Errorf("TP16 KV over all GPUs = %v, want %v (heads replicated)", got, want)
	}
}

func TestTransferTime(t *testing.T) {
	tests := []struct {
		n    int64
		bw   float64
		want time.Duration
	}{
		{1e9, 1e9, time.Second},
		{0, 1e9, 0},
		{-1, 1e9, 0},
		{1, 0, math.MaxInt64},
		{1, math.NaN(), math.MaxInt64},
		{3125, 25e9 / 8, time.Microsecond},
	}
	for _, tc := range tests {
		if got := TransferTime(tc.n, tc.bw); got != tc.want {
			t.Errorf("TransferTime(%d, %v) = %v, want %v", tc.n, tc.bw, got, tc.want)
		}
	}
	// An 8k-token Llama-3-70B prompt carries 2.7 GB of KV: ≈215 ms at
	// 100 Gb/s.
	p := mustLoad(t, "h200/llama-3-70b/tp4")
	if got := p.KVTransferTime(8192, 100e9/8); got.Round(time.Millisecond) != 215*time.Millisecond {
		t.Errorf("KVTransferTime(8192, 100 Gb/s) = %v, want ≈215ms", got)
	}
}

func TestEvaluateErrors(t *testing.T) {
	p := mustLoad(t, "a100-80g/opt-13b/tp1")
	_, err := p.Evaluate(Point{Name: "x", Metric: MetricGEMMMs, Prefill: []int{1}, Value: 1, Check: CheckFit})
	if !errors.Is(err, ErrInvalidProfile) {
		t.Errorf("GEMM metric on a DistServe profile: %v, want ErrInvalidProfile", err)
	}
	bad := ModelShape{}
	_, err = p.Evaluate(Point{Name: "x", Metric: MetricStepMs, Prefill: []int{1}, Value: 1, Check: CheckFit, Spec: &bad})
	if !errors.Is(err, ErrInvalidProfile) {
		t.Errorf("invalid spec override: %v, want ErrInvalidProfile", err)
	}
}

func TestPointOverrideUsesOtherShapeAndTP(t *testing.T) {
	p := mustLoad(t, "h100/llama-3-70b/tp4")
	small := mustLoad(t, "h100/llama-3-8b/tp1")
	pt := Point{Name: "x", Metric: MetricStepMs, Prefill: []int{512}, Value: 1, Check: CheckReference, Spec: &small.Spec, TP: 1}
	got, err := p.Evaluate(pt)
	if err != nil {
		t.Fatal(err)
	}
	if want := small.StepSeconds(Batch{Prefill: []int{512}}) * 1e3; !relClose(got, want) {
		t.Errorf("override evaluates to %v ms, want the 8B TP1 profile's %v ms (same factors)", got, want)
	}
}

// BenchmarkStepTime measures the cost of one prediction (the planner calls
// it in its simulation loop): a colocated step of 64 decodes and a chunk.
func BenchmarkStepTime(b *testing.B) {
	for _, name := range []string{"a100-80g/opt-13b/tp1", "h100/llama-3-70b/tp4"} {
		p, err := Load(name)
		if err != nil {
			b.Fatal(err)
		}
		batch := Batch{Prefill: []int{512}, PrefillContext: []int{1024}, Decode: decodeBatch(64, 900)}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				p.StepTime(batch)
			}
		})
	}
}
