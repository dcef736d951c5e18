package perfmodel

import (
	"fmt"
	"math"
	"time"
)

// Batch is the work of one engine step: prompt chunks of prefilling
// sequences and one token of each decoding sequence. A colocated step
// carries both; a prefill or decode worker's step carries one kind.
type Batch struct {
	// Prefill holds the chunk length of each prefilling sequence, tokens.
	Prefill []int
	// PrefillContext holds, per chunk, the tokens its sequence had cached
	// before the chunk (earlier chunks, or a prefix-cache hit). nil means
	// 0 for every chunk; otherwise it has len(Prefill) entries.
	PrefillContext []int
	// Decode holds the context length of each decoding sequence: the
	// tokens the new token attends to, itself included, ≥ 1.
	Decode []int
}

// Validate reports an error for negative lengths or a PrefillContext whose
// length differs from Prefill's. StepTime does not call it: it counts
// negative values as 0 and missing contexts as 0.
func (b Batch) Validate() error {
	if b.PrefillContext != nil && len(b.PrefillContext) != len(b.Prefill) {
		return fmt.Errorf("perfmodel: batch has %d prefill chunks but %d contexts", len(b.Prefill), len(b.PrefillContext))
	}
	for i, l := range b.Prefill {
		if l < 0 {
			return fmt.Errorf("perfmodel: prefill chunk %d has negative length %d", i, l)
		}
	}
	for i, c := range b.PrefillContext {
		if c < 0 {
			return fmt.Errorf("perfmodel: prefill chunk %d has negative context %d", i, c)
		}
	}
	for i, n := range b.Decode {
		if n < 0 {
			return fmt.Errorf("perfmodel: decode sequence %d has negative context %d", i, n)
		}
	}
	return nil
}

func (b Batch) empty() bool { return len(b.Prefill) == 0 && len(b.Decode) == 0 }

// chunk returns chunk i's length l and cached context c, as float64 ≥ 0.
func (b Batch) chunk(i int) (l, c float64) {
	l = float64(max(b.Prefill[i], 0))
	if i < len(b.PrefillContext) {
		c = float64(max(b.PrefillContext[i], 0))
	}
	return l, c
}

// prefillSums returns the prefill chunks' Σl, Σq with q = (c+l)² − c²,
// and the cross-prompt count Σᵢ lᵢ·Σⱼ≠ᵢ (cⱼ + lⱼ): the cells of the step's
// other prompts each chunk token shares the step with.
func (b Batch) prefillSums() (sumL, sumQ, cross float64) {
	var cells float64
	for i := range b.Prefill {
		l, c := b.chunk(i)
		sumL += l
		sumQ += (c+l)*(c+l) - c*c
		cells += c + l
	}
	for i := range b.Prefill {
		l, c := b.chunk(i)
		cross += l * (cells - c - l)
	}
	return sumL, sumQ, cross
}

// StepTime returns how long the step b takes on the profile's GPUs, rounded
// to the nanosecond; an empty batch takes 0. See StepSeconds.
func (p *Profile) StepTime(b Batch) time.Duration { return seconds(p.StepSeconds(b)) }

// PrefillTime is StepTime of a batch of whole prompts with these lengths.
func (p *Profile) PrefillTime(lengths []int) time.Duration {
	return p.StepTime(Batch{Prefill: lengths})
}

// DecodeTime is StepTime of one decode step of sequences at these context
// lengths.
func (p *Profile) DecodeTime(contexts []int) time.Duration {
	return p.StepTime(Batch{Decode: contexts})
}

// StepSeconds returns the modeled duration of step b in seconds (≥ 0).
//
// FormDistServe, with DistServe's prefill (a_p, b_p, c_p) and decode
// (a_d, b_d, c_d) coefficients, the decode pair chosen by the number D of
// decode sequences:
//
//	prefill only:  a_p + b_p·Σl + c_p·Σq + x·X
//	decode only:   a_d + b_d·Σn + c_d·D
//	mixed:         max(a_p, a_d) + b_p·Σl + c_p·Σq + x·X + b_d·Σn + c_d·D
//	               + m0 + m1·Σn + m2·Σl·Σn
//
// where q = (c+l)² − c² is the attention term of a chunk of l tokens after c
// cached ones (l² for a whole prompt, so prefill-only batches of whole
// prompts reproduce DistServe's formula exactly), n are decode context
// lengths, and X = Σᵢ lᵢ·Σⱼ≠ᵢ (cⱼ + lⱼ) counts each chunk token against the
// cells of the step's other prompts; x (PrefillCross) is 0 in DistServe's
// own profiles. In llama.cpp's unified KV cache every token of a step
// scans every cell the step's sequences hold, masking other sequences'
// cells out: a batch of 4 prompts of 256 tokens costs more than the
// DistServe form's 4 × 256², less than one prompt of 1024. A mixed step pays one fixed cost and every item's marginal cost:
// the prefill chunks' cost is the interference a decode batch suffers.
// The Mixed coefficients (m0, m1, m2), 0 in DistServe's own profiles, add
// what the parts cost together beyond that. On llama.cpp's CPU backend
// with one unified KV cache the extra was measured to follow the decode
// contexts Σn whatever the decode batch, and Σl·Σn; the likely cause, from
// llama.cpp's flash-attention code: decode tokens that share a ubatch with
// a chunk join a tile of 64 query rows computed densely over every decode
// sequence's cells (m1·Σn), and every chunk token scans those cells of the
// cache (m2·Σl·Σn).
//
// FormRoofline, per GPU of the tensor-parallel group (P body parameters, H
// LM-head parameters, T tokens, S sequences in the step):
//
//	GEMM       smoothmax_p(2·(P·T + H·S)/TP / (peak·compute_eff),
//	                       weight bytes/TP / (HBM·memory_eff))
//	attention  prefill: max(4·heads·d·layers·pairs/TP / (peak·attention_eff),
//	                        KV bytes of c+l tokens/TP / (HBM·memory_eff))
//	           decode:  the same with pairs = Σn and KV bytes of Σn tokens
//	all-reduce 2·layers·(latency + 2(TP−1)/TP · T·hidden·2 bytes / link)   (TP > 1)
//	overhead   step_overhead + seq_overhead·S
//
// summed, where pairs = Σ l·c + l(l+1)/2 counts query–key pairs. Decode
// tokens share the weight read with prefill chunks, so a mixed step costs
// less than the two steps apart but more than either.
func (p *Profile) StepSeconds(b Batch) float64 {
	if b.empty() {
		return 0
	}
	var s float64
	switch p.Form {
	case FormDistServe:
		s = p.DistServe.seconds(b)
	default:
		s = p.rooflineParts(b).total()
	}
	return max(s, 0)
}

func (d *DistServe) seconds(b Batch) float64 {
	nP, nD := len(b.Prefill), len(b.Decode)
	dec := d.DecodeSmall
	if nD >= d.LargeBatchThreshold {
		dec = d.DecodeLarge
	}
	sumL, sumQ, cross := b.prefillSums()
	var sumN float64
	for _, n := range b.Decode {
		sumN += float64(max(n, 0))
	}
	pf := d.Prefill
	var ms float64
	switch {
	case nD == 0:
		ms = pf[0] + pf[1]*sumL + pf[2]*sumQ + d.PrefillCross*cross
	case nP == 0:
		ms = dec[0] + dec[1]*sumN + dec[2]*float64(nD)
	default:
		ms = max(pf[0], dec[0]) + pf[1]*sumL + pf[2]*sumQ + d.PrefillCross*cross + dec[1]*sumN + dec[2]*float64(nD)
		mx := d.Mixed
		ms += mx[0] + mx[1]*sumN + mx[2]*sumL*sumN
	}
	return ms / 1e3
}

// parts is the roofline's step time split by component, in seconds.
type parts struct {
	gemm, attention, comm, overhead float64
}

func (t parts) total() float64 { return t.gemm + t.attention + t.comm + t.overhead }

func (p *Profile) rooflineParts(b Batch) parts {
	r, m, h := p.Roofline, p.Spec, p.Hardware
	tp := float64(p.TP)
	heads := math.Ceil(float64(m.Heads) / tp)
	kvPerGPU := p.kvBytesPerTokenPerGPU()
	peak := h.BF16FLOPS
	hbm := h.HBMBytesPerSec * r.MemoryEfficiency
	attnFLOPsPerPair := 4 * heads * float64(m.HeadDim) * float64(m.Layers)

	var tokens, pairs, prefKV, decCtx float64
	for i := range b.Prefill {
		l, c := b.chunk(i)
		tokens += l
		pairs += l*c + l*(l+1)/2
		prefKV += c + l
	}
	for _, n := range b.Decode {
		decCtx += float64(max(n, 0))
	}
	tokens += float64(len(b.Decode))
	seqs := float64(len(b.Prefill) + len(b.Decode))

	var t parts
	compute := 2 * (m.bodyParams()*tokens + m.headParams()*seqs) / tp / (peak * r.ComputeEfficiency)
	weights := m.WeightBytes() / tp / hbm
	t.gemm = smoothMax(compute, weights, r.Overlap)
	if pairs > 0 {
		t.attention += max(attnFLOPsPerPair*pairs/(peak*r.AttentionEfficiency), prefKV*kvPerGPU/hbm)
	}
	if decCtx > 0 {
		t.attention += max(attnFLOPsPerPair*decCtx/(peak*r.AttentionEfficiency), decCtx*kvPerGPU/hbm)
	}
	if p.TP > 1 {
		bytes := tokens * float64(m.Hidden) * 2
		t.comm = 2 * float64(m.Layers) * (r.AllReduceLatencyUs/1e6 + 2*(tp-1)/tp*bytes/h.LinkBytesPerSec)
	}
	t.overhead = (r.StepOverheadMs + r.SeqOverheadMs*seqs) / 1e3
	return t
}

// smoothMax returns (aᵖ + bᵖ)^(1/p) for a, b ≥ 0 and p ≥ 1, computed
// without overflow: a + b at p = 1, → max(a, b) as p grows.
func smoothMax(a, b, p float64) float64 {
	hi, lo := max(a, b), min(a, b)
	if hi == 0 {
		return 0
	}
	if p == 1 {
		return hi + lo
	}
	return hi * math.Pow(1+math.Pow(lo/hi, p), 1/p)
}

// seconds converts s seconds to a Duration, rounded to the nanosecond and
// saturated at the Duration range.
func seconds(s float64) time.Duration {
	ns := math.Round(s * 1e9)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}
