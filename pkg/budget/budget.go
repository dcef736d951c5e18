package budget

import (
	"slices"
	"time"

	"go.uber.org/zap"
)

// Trace collects the boundaries and facts of one request.
type Trace struct {
	RequestID string
	// TraceID is the OpenTelemetry trace id of the request (32 hex
	// digits) when it is traced, for the log line; "" otherwise.
	TraceID string
	Model   string
	// Mode is how the request was served: vocab.ModeDisaggregated (remote
	// prefill), vocab.ModeLocal (prefill on the decode worker in
	// disaggregated mode) or vocab.ModeColocated.
	Mode             string
	FirstTokenPolicy string // vocab.PolicyPrefill or vocab.PolicyDecode

	Arrival, Routed                         time.Time
	PrefillQueued, PrefillStart, PrefillEnd time.Time
	KVFirstByte, KVDone                     time.Time
	DecodeJoined                            time.Time
	FirstToken, LastToken                   time.Time
	// Ended is when the response's end went to the client (set by the
	// frontend as a successful response ends): the end of e2e for a
	// reply that delivered no token (its first token was its end).
	Ended time.Time
	// FirstOutput is when the first output that is not reasoning (answer
	// text or a tool call) reached the client: set by Output; zero when
	// the request delivered none.
	FirstOutput time.Time

	PromptTokens, OutputTokens int
	BatchSize                  int // decode batch size seen by the request (largest reported)
	PrefillBatch               int // prefill batch size on the prefill worker
	PrefixHitTokens            int // prompt tokens the prefilling worker took from its prefix cache
	// HostHitTokens are the part of PrefixHitTokens the worker loaded from
	// its prefix cache's host-memory tier (the rest were in engine
	// memory), and HostLoad the time that load took, as the worker
	// measured it (the modeled host-link time on the performance-model
	// engine, inside Prefill; the imports' wall time otherwise, inside
	// Queue).
	HostHitTokens int
	HostLoad      time.Duration
	// DiskHitTokens are the part of HostHitTokens read from the disk tier
	// behind the host tier.
	DiskHitTokens int
	// PeerHitTokens are the part of PrefixHitTokens the worker pulled
	// from a peer worker's cache instead of computing them (source peer;
	// the rest were its own), and PeerLoad the time the pull and import
	// took (inside Queue: the pull runs before the request queues).
	PeerHitTokens int
	PeerLoad      time.Duration
	// DecodePrefixHitTokens are the prompt tokens the decode worker held
	// in its prefix cache at Reserve: their KV was not sent.
	DecodePrefixHitTokens int
	// RoutedPrefixHitTokens is the router's estimate of PrefixHitTokens
	// for the worker it chose to prefill (from the coordinator's index of
	// the workers' caches): how much of the real hit routing saw coming.
	// Not in the summary; metrics count it.
	RoutedPrefixHitTokens   int
	KVBytesRaw, KVBytesWire int64
	Codec                   string
	// CodecReason says why the prefill worker chose Codec when it chose
	// per transfer (codec "auto"); "" when the codec was named.
	CodecReason    string
	PrefillWorker  string
	DecodeWorker   string
	Recoveries     int    // decode-worker failovers
	PrefillRetries int    // prefill workers tried again after one failed before the first token
	FinishReason   string // "stop", "length", or "" when it did not finish
	Status         string // outcome label, see pkg/metrics
	// Cache is the response cache's answer for this request: CacheHit
	// (replayed, no worker involved), CacheMiss (looked up, not found),
	// or "" when it was not looked up (the cache is off, or the request
	// cannot be cached).
	Cache string

	// Objective is the request's latency objective and, when it named a
	// tier alias, the tier's choice; zero when neither applies.
	Objective Objective
	// Region is where the request was served and how it got there; zero
	// without regions (package region).
	Region Region
	// ClientRTT is the round trip between the client and the coordinator
	// it called, as the kernel measured it on the client's TCP connection
	// (Linux's smoothed RTT) when the request arrived: the request's way
	// in and the first token's way out, a term of the TTFT the client
	// sees that the coordinator's clock does not. 0 where it cannot be
	// measured (another OS, a connection that is not TCP) and on a
	// request another region forwarded (Region.RTT is its network term).
	ClientRTT time.Duration

	// ITLs are the gaps between successive token deliveries to the client
	// (a delivery may carry several tokens). Appended by Tokens.
	ITLs []time.Duration

	// Pricing, when not nil, prices the request (see Cost): the cost
	// fields of Summary and Fields and pdserve_cost_usd_total. Shared and
	// read-only; nil (no price configured) reports no cost.
	Pricing *Pricing
	// Warnings are things the client and the operator must know about
	// the figures of this request (e.g. an engine that fell behind its
	// performance model), added by Warn; nil when there are none.
	Warnings []string
}

// Warn adds msg to Warnings unless it is there already.
func (t *Trace) Warn(msg string) {
	if !slices.Contains(t.Warnings, msg) {
		t.Warnings = append(t.Warnings, msg)
	}
}

// Tokens records that n tokens were handed to the client at now: the first
// call sets FirstToken, every call sets LastToken and adds an ITL gap
// after the first.
func (t *Trace) Tokens(now time.Time, n int) {
	if n <= 0 {
		return
	}
	if t.FirstToken.IsZero() {
		t.FirstToken = now
	} else {
		t.ITLs = append(t.ITLs, now.Sub(t.LastToken))
	}
	t.LastToken = now
	t.OutputTokens += n
}

// Output records that output other than reasoning reached the client at
// now; the first call sets FirstOutput.
func (t *Trace) Output(now time.Time) {
	if t.FirstOutput.IsZero() {
		t.FirstOutput = now
	}
}

// Terms are the derived latencies of a request; see the package doc.
type Terms struct {
	TTFT, TPOT, E2E time.Duration
	// TTFO is the time to the first output token that is not reasoning
	// (AIPerf's definition); TTFT for a reply without reasoning.
	TTFO                         time.Duration
	Queue, Prefill               time.Duration
	KVTransfer, KVStream, Decode time.Duration
	// HostLoad is Trace.HostLoad: of TTFT, the prefix's load from the
	// worker's host tier.
	HostLoad time.Duration
	// PeerLoad is Trace.PeerLoad: of TTFT, the prefix's pull from a peer
	// worker.
	PeerLoad time.Duration
	// ClientRTT is Trace.ClientRTT: the network term outside TTFT (the
	// client sees about TTFT + ClientRTT).
	ClientRTT time.Duration
}

// Terms derives the latency terms from the boundaries.
func (t *Trace) Terms() Terms {
	var s Terms
	s.TTFT = span(t.Arrival, t.FirstToken)
	s.TTFO = span(t.Arrival, t.FirstOutput)
	s.E2E = span(t.Arrival, t.LastToken)
	if t.LastToken.IsZero() {
		s.E2E = span(t.Arrival, t.Ended)
	}
	if t.OutputTokens > 1 {
		s.TPOT = (s.E2E - s.TTFT) / time.Duration(t.OutputTokens-1)
	}
	s.Queue = span(t.Arrival, t.PrefillStart)
	s.Prefill = span(t.PrefillStart, t.PrefillEnd)
	s.KVTransfer = span(t.PrefillEnd, t.KVDone)
	s.KVStream = span(t.KVFirstByte, t.KVDone)
	s.Decode = span(t.FirstToken, t.LastToken)
	s.HostLoad = max(t.HostLoad, 0)
	s.PeerLoad = max(t.PeerLoad, 0)
	s.ClientRTT = max(t.ClientRTT, 0)
	return s
}

// BudgetLeft returns what is left at now of the request's TTFT budget
// for the terms still ahead of it: the budget less the network terms
// outside the coordinator's clock (ClientRTT) and the time spent since
// Arrival (admission, reading the body, placement). ok is false when the
// request has no budget; left ≤ 0 when it is spent. A clock before
// Arrival counts as no time spent.
func (t *Trace) BudgetLeft(now time.Time) (left time.Duration, ok bool) {
	b := t.Objective.TTFTBudget
	if b <= 0 {
		return 0, false
	}
	return b - max(t.ClientRTT, 0) - span(t.Arrival, now), true
}

// span is b − a, or 0 when either is unset or b is before a.
func span(a, b time.Time) time.Duration {
	if a.IsZero() || b.IsZero() || b.Before(a) {
		return 0
	}
	return b.Sub(a)
}

// Summary is the `pdserve` object a client sees on the final stream chunk
// and on a non-streaming response. Durations are milliseconds. The cost
// fields are present only when the request was priced (Trace.Pricing
// set): cost_usd and cost_usd_per_1k_tokens (prompt plus output tokens;
// absent for a request without tokens), and gpu_seconds under GPU-time
// pricing; see Trace.Cost.
type Summary struct {
	TTFTMs float64 `json:"ttft_ms"`
	// TTFOMs is the time to the first non-reasoning output (answer or
	// tool call); 0 when there was none.
	TTFOMs       float64 `json:"ttfo_ms"`
	TPOTMs       float64 `json:"tpot_ms"`
	QueueMs      float64 `json:"queue_ms"`
	PrefillMs    float64 `json:"prefill_ms"`
	KVTransferMs float64 `json:"kv_transfer_ms"`
	KVStreamMs   float64 `json:"kv_stream_ms"`
	// HostLoadMs is Terms.HostLoad; omitted when 0 (no host-tier hit).
	HostLoadMs float64 `json:"host_load_ms,omitempty"`
	// PeerLoadMs is Terms.PeerLoad; omitted when 0 (no pull).
	PeerLoadMs      float64 `json:"peer_load_ms,omitempty"`
	DecodeMs        float64 `json:"decode_ms"`
	E2EMs           float64 `json:"e2e_ms"`
	PromptTokens    int     `json:"prompt_tokens"`
	OutputTokens    int     `json:"output_tokens"`
	PrefixHitTokens int     `json:"prefix_hit_tokens"`
	// DecodePrefixHitTokens: prompt tokens whose KV the decode worker
	// already held (not sent); omitted when 0.
	DecodePrefixHitTokens int `json:"decode_prefix_hit_tokens,omitempty"`
	// HostPrefixHitTokens: of prefix_hit_tokens, those loaded from the
	// worker's host-memory tier (the rest were in engine memory); omitted
	// when 0.
	HostPrefixHitTokens int `json:"host_prefix_hit_tokens,omitempty"`
	// DiskPrefixHitTokens: of host_prefix_hit_tokens, those read from the
	// disk tier; omitted when 0.
	DiskPrefixHitTokens int `json:"disk_prefix_hit_tokens,omitempty"`
	// PeerPrefixHitTokens: of prefix_hit_tokens, those pulled from a peer
	// worker's cache (the rest were the prefilling worker's own); omitted
	// when 0.
	PeerPrefixHitTokens int    `json:"peer_prefix_hit_tokens,omitempty"`
	BatchSize           int    `json:"batch_size"`
	KVBytesRaw          int64  `json:"kv_bytes_raw"`
	KVBytesWire         int64  `json:"kv_bytes_wire"`
	Codec               string `json:"codec"`
	// CodecReason repeats Trace.CodecReason; omitted when empty.
	CodecReason      string `json:"codec_reason,omitempty"`
	PrefillWorker    string `json:"prefill_worker"`
	DecodeWorker     string `json:"decode_worker"`
	Mode             string `json:"mode"`
	FirstTokenPolicy string `json:"first_token_policy"`
	Recoveries       int    `json:"recoveries,omitempty"`
	PrefillRetries   int    `json:"prefill_retries,omitempty"`
	// Cache repeats Trace.Cache: "hit" or "miss", absent when not looked up.
	Cache string `json:"cache,omitempty"`
	// The objective's fields (Objective), each absent when unset.
	Priority        string   `json:"priority,omitempty"`
	TTFTBudgetMs    float64  `json:"ttft_budget_ms,omitempty"`
	Tier            string   `json:"tier,omitempty"`
	TierFallback    string   `json:"tier_fallback,omitempty"`
	TierPassed      []string `json:"tier_passed,omitempty"`
	PredictedTTFTMs float64  `json:"predicted_ttft_ms,omitempty"`
	// The region's fields (Region), each absent when unset.
	Region       string  `json:"region,omitempty"`
	OriginRegion string  `json:"origin_region,omitempty"`
	RegionRTTMs  float64 `json:"region_rtt_ms,omitempty"`
	// ClientRTTMs is Terms.ClientRTT, the client's network term; absent
	// where it was not measured.
	ClientRTTMs float64 `json:"client_rtt_ms,omitempty"`

	CostUSD            *float64 `json:"cost_usd,omitempty"`
	CostUSDPer1kTokens *float64 `json:"cost_usd_per_1k_tokens,omitempty"`
	GPUSeconds         *float64 `json:"gpu_seconds,omitempty"`
	// Warnings repeats Trace.Warnings.
	Warnings []string `json:"warnings,omitempty"`
}

// Summary returns the client-facing budget of the request so far.
func (t *Trace) Summary() Summary {
	s := t.Terms()
	sum := Summary{
		TTFTMs:                ms(s.TTFT),
		TTFOMs:                ms(s.TTFO),
		TPOTMs:                ms(s.TPOT),
		QueueMs:               ms(s.Queue),
		PrefillMs:             ms(s.Prefill),
		KVTransferMs:          ms(s.KVTransfer),
		KVStreamMs:            ms(s.KVStream),
		HostLoadMs:            ms(s.HostLoad),
		PeerLoadMs:            ms(s.PeerLoad),
		DecodeMs:              ms(s.Decode),
		E2EMs:                 ms(s.E2E),
		PromptTokens:          t.PromptTokens,
		OutputTokens:          t.OutputTokens,
		PrefixHitTokens:       t.PrefixHitTokens,
		DecodePrefixHitTokens: t.DecodePrefixHitTokens,
		HostPrefixHitTokens:   t.HostHitTokens,
		DiskPrefixHitTokens:   t.DiskHitTokens,
		PeerPrefixHitTokens:   t.PeerHitTokens,
		BatchSize:             t.BatchSize,
		KVBytesRaw:            t.KVBytesRaw,
		KVBytesWire:           t.KVBytesWire,
		Codec:                 t.Codec,
		CodecReason:           t.CodecReason,
		PrefillWorker:         t.PrefillWorker,
		DecodeWorker:          t.DecodeWorker,
		Mode:                  t.Mode,
		FirstTokenPolicy:      t.FirstTokenPolicy,
		Recoveries:            t.Recoveries,
		PrefillRetries:        t.PrefillRetries,
		Cache:                 t.Cache,
		Warnings:              slices.Clone(t.Warnings),
		Priority:              t.Objective.Priority,
		TTFTBudgetMs:          ms(t.Objective.TTFTBudget),
		Tier:                  t.Objective.Tier,
		TierFallback:          t.Objective.TierFallback,
		TierPassed:            slices.Clone(t.Objective.TierPassed),
		PredictedTTFTMs:       ms(t.Objective.PredictedTTFT),
		Region:                t.Region.Name,
		OriginRegion:          t.Region.Origin,
		RegionRTTMs:           ms(t.Region.RTT),
		ClientRTTMs:           ms(s.ClientRTT),
	}
	if c, ok := t.Cost(); ok {
		sum.CostUSD = ptr(roundSig(c.USD))
		if t.PromptTokens+t.OutputTokens > 0 {
			sum.CostUSDPer1kTokens = ptr(roundSig(c.USDPer1kTokens))
		}
		if t.Pricing.GPUHourUSD > 0 {
			sum.GPUSeconds = ptr(roundSig(c.GPUSeconds))
		}
	}
	return sum
}

func ptr(x float64) *float64 { return &x }

// ms converts to milliseconds with microsecond resolution.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Fields returns the zap fields of the one request log line: identity,
// sizes, workers, the cost when priced (as in Summary), warnings when
// there are any, every derived term and every boundary timestamp.
func (t *Trace) Fields() []zap.Field {
	s := t.Terms()
	f := []zap.Field{
		zap.String("request_id", t.RequestID),
		zap.String("status", t.Status),
		zap.String("finish_reason", t.FinishReason),
		zap.String("model", t.Model),
		zap.String("tier", t.Objective.Tier),
		zap.String("tier_fallback", t.Objective.TierFallback),
		zap.Strings("tier_passed", t.Objective.TierPassed),
		zap.String("priority", t.Objective.Priority),
		zap.Float64("ttft_budget_ms", ms(t.Objective.TTFTBudget)),
		zap.Float64("predicted_ttft_ms", ms(t.Objective.PredictedTTFT)),
		zap.String("region", t.Region.Name),
		zap.String("origin_region", t.Region.Origin),
		zap.Float64("region_rtt_ms", ms(t.Region.RTT)),
		zap.String("mode", t.Mode),
		zap.String("first_token_policy", t.FirstTokenPolicy),
		zap.Int("prompt_tokens", t.PromptTokens),
		zap.Int("output_tokens", t.OutputTokens),
		zap.Int("batch_size", t.BatchSize),
		zap.Int("prefill_batch", t.PrefillBatch),
		zap.Int("prefix_hit_tokens", t.PrefixHitTokens),
		zap.Int("decode_prefix_hit_tokens", t.DecodePrefixHitTokens),
		zap.Int64("kv_bytes_raw", t.KVBytesRaw),
		zap.Int64("kv_bytes_wire", t.KVBytesWire),
		zap.String("codec", t.Codec),
		zap.String("prefill_worker", t.PrefillWorker),
		zap.String("decode_worker", t.DecodeWorker),
		zap.Int("recoveries", t.Recoveries),
		zap.Int("prefill_retries", t.PrefillRetries),
		zap.Duration("ttft", s.TTFT),
		zap.Duration("ttfo", s.TTFO),
		zap.Duration("tpot", s.TPOT),
		zap.Duration("queue", s.Queue),
		zap.Duration("prefill", s.Prefill),
		zap.Duration("kv_transfer", s.KVTransfer),
		zap.Duration("kv_stream", s.KVStream),
		zap.Duration("decode", s.Decode),
		zap.Duration("e2e", s.E2E),
	}
	if c, ok := t.Cost(); ok {
		f = append(f, zap.Float64("cost_usd", roundSig(c.USD)))
		if t.PromptTokens+t.OutputTokens > 0 {
			f = append(f, zap.Float64("cost_usd_per_1k_tokens", roundSig(c.USDPer1kTokens)))
		}
		if t.Pricing.GPUHourUSD > 0 {
			f = append(f, zap.Float64("gpu_seconds", roundSig(c.GPUSeconds)))
		}
	}
	if t.TraceID != "" {
		f = append(f, zap.String("trace_id", t.TraceID))
	}
	if t.Cache != "" {
		f = append(f, zap.String("cache", t.Cache))
	}
	if t.CodecReason != "" {
		f = append(f, zap.String("codec_reason", t.CodecReason))
	}
	if t.HostHitTokens > 0 || t.HostLoad > 0 {
		f = append(f, zap.Int("host_prefix_hit_tokens", t.HostHitTokens), zap.Duration("host_load", s.HostLoad))
	}
	if t.DiskHitTokens > 0 {
		f = append(f, zap.Int("disk_prefix_hit_tokens", t.DiskHitTokens))
	}
	if t.PeerHitTokens > 0 || t.PeerLoad > 0 {
		f = append(f, zap.Int("peer_prefix_hit_tokens", t.PeerHitTokens), zap.Duration("peer_load", s.PeerLoad))
	}
	if s.ClientRTT > 0 {
		f = append(f, zap.Duration("client_rtt", s.ClientRTT))
	}
	if len(t.Warnings) > 0 {
		f = append(f, zap.Strings("warnings", t.Warnings))
	}
	for _, b := range []struct {
		name string
		at   time.Time
	}{
		{"t_arrival", t.Arrival}, {"t_routed", t.Routed},
		{"t_prefill_queued", t.PrefillQueued}, {"t_prefill_start", t.PrefillStart}, {"t_prefill_end", t.PrefillEnd},
		{"t_kv_first_byte", t.KVFirstByte}, {"t_kv_done", t.KVDone}, {"t_decode_joined", t.DecodeJoined},
		{"t_first_token", t.FirstToken}, {"t_first_output", t.FirstOutput}, {"t_last_token", t.LastToken},
	} {
		if !b.at.IsZero() {
			f = append(f, zap.Time(b.name, b.at))
		}
	}
	return f
}

// Log writes the request log line at info level.
func (t *Trace) Log(l *zap.Logger) {
	l.Info("request", t.Fields()...)
}

// Outcome labels for Trace.Status and the requests counter of pkg/metrics.
const (
	StatusOK          = "ok"          // finished: stop or length
	StatusCancelled   = "cancelled"   // the client went away
	StatusError       = "error"       // failed after admission (worker error)
	StatusInvalid     = "invalid"     // refused: bad request (4xx)
	StatusRejected    = "rejected"    // refused: overload (429)
	StatusUnavailable = "unavailable" // refused: no workers (503)
	StatusForwarded   = "forwarded"   // served by another region (package region); its terms are that region's
)

// Values of Trace.Cache and of the result label of
// pdserve_response_cache_requests_total.
const (
	CacheHit  = "hit"
	CacheMiss = "miss"
)

// Objective is a request's latency objective (config.Objective) and, for
// a request that named a tier alias, what the tier chose (package tiers).
type Objective struct {
	// Priority is "interactive" or "batch"; "" when no objective applied.
	Priority string
	// TTFTBudget is the time to first token asked; 0: none.
	TTFTBudget time.Duration
	// Tier is the alias the request named, "" when it named a model.
	Tier string
	// TierFallback is why the tier's first model did not serve (down,
	// shedding, over_budget); "" when it did.
	TierFallback string
	// TierPassed are the tier's models passed over before the one that
	// served, in order (nil when the first served): each was asked for
	// first and could not take the request, so it counts in their
	// demand (package plannerhost).
	TierPassed []string
	// PredictedTTFT is the chosen model's predicted TTFT; 0 when
	// unmeasured or no tier.
	PredictedTTFT time.Duration
}

// Region is where a request was served in a federation of regions
// (package region), and the network term of getting it there.
type Region struct {
	// Name is the region that served the request.
	Name string
	// Origin is the region whose coordinator the client called, when
	// that coordinator forwarded the request here; "" when the client
	// called this region.
	Origin string
	// RTT is the round trip between the origin's coordinator and this
	// region's, as the origin measured it over the federation (a term
	// of the client's TTFT that this region's own terms leave out); 0
	// when not forwarded.
	RTT time.Duration
}
