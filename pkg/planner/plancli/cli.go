package plancli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner"
)

// Options are the flags of `coordinator plan`.
type Options struct {
	Profiles      []string // prefill (and colocated) profiles; several = what-if
	DecodeProfile string   // "" = the same as the profile
	// ColocatedProfile is the colocated workers' profile when it differs
	// (on a CPU: another thread count); "" = the same as the profile.
	ColocatedProfile string
	Workload         string
	Samples          int
	Rate             float64
	Burstiness       float64
	SLOTTFT          time.Duration
	SLOTPOT          time.Duration
	Attainment       float64
	LinkGbps         float64
	Codec            string
	// CodecProfile is where the codecs' figures come from:
	// planner.CodecProfileBuiltin, planner.CodecProfileSelf or a file of
	// `coordinator codecs --out`.
	CodecProfile string
	CodecRatio   float64 // 0 = the codec's
	CodecMBps    float64 // per core, both directions; 0 = the codec's
	CodecCores   int
	Policy       string
	Ingress      time.Duration
	GPUBudget    int    // 0 = 16 GPUs; CPU profiles: the logical CPUs the profile was measured on
	GPUCost      string // "2.5" or "a100-80g=1.9,h100=3.5"
	Limits       planner.Limits
	Requests     int
	Seed         uint64
	Output       string // table or json
	Plot         string // PNG file, "" = none
	// PrefixCacheTokens and HostCacheTokens are each worker's prefix-cache
	// tiers (planner.Cache); HostLinkGbps the host tier's link, Gb/s;
	// PrefixRouting the routing; CacheSweep plans every size of
	// planner.SweepCache too.
	PrefixCacheTokens int64
	HostCacheTokens   int64
	// HostCacheBytes sizes the host tier as the workers do
	// (--host-cache-bytes: bytes of true KV); Configs turns it into tokens
	// by the prefill profile's KV bytes per token. 0: HostCacheTokens.
	HostCacheBytes int64
	HostLinkGbps   float64
	PrefixRouting  string
	CacheSweep     bool
	// PolicyFile, when set, is a coordinator policy whose tiers name the
	// served models to plan: each model is planned apart, with its
	// profile from ModelProfiles and its rate from ModelRates (per-tier
	// planning; Profiles and Rate are then not used).
	PolicyFile string
	// ModelProfiles and ModelRates are each tier model's profile and
	// request rate, req/s (0 or absent: the highest goodput per GPU).
	ModelProfiles map[string]string
	ModelRates    map[string]float64
	// Design, when set, evaluates that one design at Rate instead of
	// searching: "P:D" or "PP+DD" (e.g. "2P+1D") disaggregated, "NC"
	// colocated (step budget from --max-batch-tokens).
	Design string
	// Window, when > 0, cuts the trace into windows of this length and
	// plans each at its own rate (planWindows): the design window by
	// window and the role changes a day that implies.
	Window time.Duration
	// GPUs, when > 0 (with Window only), fixes the pool: every window
	// uses exactly GPUs (GPUs / tp workers), split between prefill and
	// decode as that window's best predicted attainment asks
	// (fixedWindowPlans); 0 gives each window the fewest GPUs that meet
	// the SLO.
	GPUs int
}

// DefaultOptions returns the flag defaults.
func DefaultOptions() Options {
	return Options{
		Attainment:   0.9,
		LinkGbps:     100,
		Codec:        "none",
		CodecProfile: planner.CodecProfileBuiltin,
		Policy:       string(planner.PolicyPrefill),
		GPUCost:      "2",
		Requests:     planner.DefaultRequests,
		Seed:         1,
		Output:       "table",

		PrefixCacheTokens: planner.CacheAuto,
		HostLinkGbps:      planner.DefaultHostLinkBytesPerSec * 8 / 1e9,
		PrefixRouting:     string(planner.RoutePrefix),
		CacheSweep:        true,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.Func("profile", "performance-model profile `GPU/MODEL/tpN` or a profile .json file, for prefill, decode and colocated workers; repeat it or give a comma-separated list for a what-if side by side (the list: coordinator profiles)", func(s string) error {
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				o.Profiles = append(o.Profiles, p)
			}
		}
		return nil
	})
	fs.StringVar(&o.DecodeProfile, "decode-profile", o.DecodeProfile, "profile of the decode workers when it differs (e.g. another tensor-parallel degree); only with one --profile")
	fs.StringVar(&o.ColocatedProfile, "colocated-profile", o.ColocatedProfile, "profile of the colocated workers when it differs (a CPU profile at another thread count, e.g. t2 against the pools' t1); only with one --profile")
	fs.StringVar(&o.Workload, "workload", o.Workload, "fixed:IN/OUT, an Azure trace .csv, a Mooncake .jsonl, a ShareGPT .json or a loadtest result .json")
	fs.IntVar(&o.Samples, "samples", o.Samples, "ShareGPT conversations to sample (0 = 10000)")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "request rate to plan for, req/s; 0 finds the highest goodput per GPU")
	fs.Float64Var(&o.Burstiness, "burstiness", o.Burstiness, "gamma shape of inter-arrival times (1 = Poisson, < 1 burstier); 0 = the workload's (trace gaps replayed, else Poisson)")
	fs.DurationVar(&o.SLOTTFT, "slo-ttft", o.SLOTTFT, "time-to-first-token SLO, e.g. 250ms (required)")
	fs.DurationVar(&o.SLOTPOT, "slo-tpot", o.SLOTPOT, "time-per-output-token SLO, e.g. 100ms (required)")
	fs.Float64Var(&o.Attainment, "attainment", o.Attainment, "fraction of requests that must meet both SLOs, (0, 1]")
	fs.Float64Var(&o.LinkGbps, "link-gbps", o.LinkGbps, "bandwidth between the pools per worker, each direction, Gb/s")
	fs.StringVar(&o.Codec, "codec", o.Codec, "KV wire codec: "+strings.Join(planner.CodecNames(), ", ")+"; auto or auto-lossy: the codec the prefill workers would choose for --link-gbps at --codec-cores")
	fs.StringVar(&o.CodecProfile, "codec-profile", o.CodecProfile, "codec ratios and per-core speeds to plan with: builtin (measured by `coordinator codecs` on the CPU named in the plan), a file written by `coordinator codecs --out` on the target hardware, or self (measure this machine now: the plan then follows its load)")
	fs.Float64Var(&o.CodecRatio, "codec-ratio", o.CodecRatio, "override the codec's compression ratio (raw/wire)")
	fs.Float64Var(&o.CodecMBps, "codec-mbps", o.CodecMBps, "override the codec's encode and decode speed, raw MB/s per core")
	fs.IntVar(&o.CodecCores, "codec-cores", o.CodecCores, "cores each worker codes KV with (0: 16; CPU profiles: a worker's threads)")
	fs.StringVar(&o.Policy, "first-token-policy", o.Policy, "first token from the prefill worker (prefill, the coordinator's default: kv_transfer in the first inter-token gap) or the decode worker (decode: kv_transfer in TTFT)")
	fs.DurationVar(&o.Ingress, "ingress", o.Ingress, "coordinator time before a request reaches the prefill queue")
	fs.IntVar(&o.GPUBudget, "gpu-budget", o.GPUBudget, "most GPUs a design may use (0: 16); with CPU profiles (coordinator profile on a CPU) the most cores, a worker taking its profile's threads (0: the logical CPUs of the machine the profile was measured on)")
	fs.StringVar(&o.GPUCost, "gpu-cost-per-hour", o.GPUCost, "USD per GPU-hour (per core-hour for CPU profiles): one price, or GPU=PRICE pairs such as a100-80g=1.9,h100=3.5 (the profile's gpu field: cpu for a CPU profile)")
	fs.IntVar(&o.Limits.MaxDecodeBatch, "max-decode-batch", 0, "fix the decode batch limit (0 = derive from the TPOT SLO)")
	fs.IntVar(&o.Limits.MaxPrefillTokens, "max-prefill-tokens", 0, "fix the prefill tokens per step (0 = derive from the TTFT SLO)")
	fs.IntVar(&o.Limits.ChunkTokens, "max-batch-tokens", 0, "fix the colocated workers' token budget per step, summed over the batch, as their --max-batch-tokens (0 = search, -1 = no chunked prefill)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "requests per simulation (more for large designs, to reach a steady state)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the simulated requests")
	fs.StringVar(&o.Output, "output", o.Output, "table or json")
	fs.StringVar(&o.Plot, "plot", o.Plot, "write a PNG of goodput per GPU against the P:D ratio to this file")
	fs.Int64Var(&o.PrefixCacheTokens, "prefix-cache-tokens", o.PrefixCacheTokens, "each prefill (colocated) worker's engine-memory prefix cache, tokens, simulated when the workload names its prompts' blocks (a Mooncake trace's hash_ids): -1 = the profile's KV memory (the workers' default), 0 = none")
	fs.Int64Var(&o.HostCacheTokens, "host-cache-tokens", o.HostCacheTokens, "each worker's host-memory prefix-cache tier, tokens (blocks the engine tier evicts; a hit loads over --host-link-gbps)")
	fs.Int64Var(&o.HostCacheBytes, "host-cache-bytes", o.HostCacheBytes, "each worker's host-memory prefix-cache tier in bytes of true KV, as the workers' --host-cache-bytes (planned as tokens by the profile's KV bytes per token; instead of --host-cache-tokens)")
	fs.Float64Var(&o.HostLinkGbps, "host-link-gbps", o.HostLinkGbps, "host-to-GPU bandwidth host-tier hits load over, Gb/s (default: PCIe Gen5 x16, about 64 GB/s per direction, as on H100 and H200)")
	fs.StringVar(&o.PrefixRouting, "prefix-routing", o.PrefixRouting, "how the simulated router places prompts when caches are simulated: prefix (the router's default prefill weights) or least-loaded")
	fs.BoolVar(&o.CacheSweep, "cache-sweep", o.CacheSweep, "with a workload that names its blocks, also plan each prefix-cache size (0, ¼, ½, 1× the engine tier; 1× plus 1, 2, 4× of it in host memory) and print what each buys")
	fs.StringVar(&o.PolicyFile, "policy", o.PolicyFile, "a coordinator policy file whose tiers name the served models: plan each model of the tiers apart, with --model-profile and --model-rate instead of --profile and --rate")
	fs.Func("model-profile", "MODEL=PROFILE: the profile of a model of the --policy tiers (repeatable, one per model)", func(v string) error {
		m, prof, ok := strings.Cut(v, "=")
		if !ok || m == "" || prof == "" {
			return fmt.Errorf("want MODEL=PROFILE, got %q", v)
		}
		if _, dup := o.ModelProfiles[m]; dup {
			return fmt.Errorf("model %s given twice", m)
		}
		if o.ModelProfiles == nil {
			o.ModelProfiles = map[string]string{}
		}
		o.ModelProfiles[m] = prof
		return nil
	})
	fs.Func("model-rate", "MODEL=RATE: the request rate, req/s, a model of the --policy tiers serves (repeatable; absent: the highest goodput per GPU)", func(v string) error {
		m, r, ok := strings.Cut(v, "=")
		rate, err := strconv.ParseFloat(r, 64)
		if !ok || m == "" || err != nil || !(rate >= 0) || math.IsInf(rate, 0) {
			return fmt.Errorf("want MODEL=RATE with a rate ≥ 0, got %q", v)
		}
		if _, dup := o.ModelRates[m]; dup {
			return fmt.Errorf("model %s given twice", m)
		}
		if o.ModelRates == nil {
			o.ModelRates = map[string]float64{}
		}
		o.ModelRates[m] = rate
		return nil
	})
	fs.StringVar(&o.Design, "design", o.Design, "predict one design at --rate instead of searching: P:D or 2P+1D (disaggregated), or 3C (colocated, needs --max-batch-tokens)")
	fs.DurationVar(&o.Window, "window", o.Window, "cut the trace (--workload, an Azure .csv or a Mooncake .jsonl) into windows of this length, e.g. 1h, and plan each at its own request rate: the design window by window and the role changes a day it implies (workers moved from one window's design to the next, scaled to 24 h; workers added or removed are not role changes)")
	fs.IntVar(&o.GPUs, "gpus", o.GPUs, "with --window: GPUs of the deployment, a fixed pool every window uses in full (workers × tp); each window gets the prefill:decode split of them with the best predicted attainment, and the role changes count the workers moved (0: each window gets the fewest GPUs that meet the SLO)")
	cliflags.AddRenamed(fs, Renamed...)
}

// Renamed are plan's former flag names: --chunk-tokens was the per-step
// budget the workers call --max-batch-tokens (theirs, --chunk-tokens, is
// the chunk of one sequence), --gpu-cost the price the coordinator calls
// --gpu-cost-per-hour. Run warns on stderr when given one.
var Renamed = []cliflags.Renamed{{Old: "chunk-tokens", New: "max-batch-tokens"}, {Old: "gpu-cost", New: "gpu-cost-per-hour"}}

// hostTokens is the host tier of each worker of profile p, tokens:
// HostCacheBytes over p's KV bytes per token when given, else
// HostCacheTokens.
func hostTokens(o *Options, p *perfmodel.Profile) int64 {
	if o.HostCacheBytes > 0 {
		return o.HostCacheBytes / max(p.KVBytesPerToken(), 1)
	}
	return o.HostCacheTokens
}

// ParseDesign reads a design: "P:D" or "PP+DD" (e.g. "2P+1D") for a
// disaggregated one, "NC" for N colocated workers with a step budget of
// chunk tokens (-1: no chunking). Errors wrap errUsage.
func ParseDesign(s string, chunk int) (planner.Design, error) {
	bad := fmt.Errorf("%w: --design %q: want P:D, 2P+1D or 3C", errUsage, s)
	num := func(x, suffix string) (int, bool) {
		x, ok := strings.CutSuffix(strings.ToUpper(strings.TrimSpace(x)), suffix)
		n, err := strconv.Atoi(x)
		return n, ok && err == nil && n >= 1
	}
	if p, d, ok := strings.Cut(s, ":"); ok {
		pn, ok1 := num(p, "")
		dn, ok2 := num(d, "")
		if !ok1 || !ok2 {
			return planner.Design{}, bad
		}
		return planner.Design{Prefill: pn, Decode: dn}, nil
	}
	if p, d, ok := strings.Cut(s, "+"); ok {
		pn, ok1 := num(p, "P")
		dn, ok2 := num(d, "D")
		if !ok1 || !ok2 {
			return planner.Design{}, bad
		}
		return planner.Design{Prefill: pn, Decode: dn}, nil
	}
	c, ok := num(s, "C")
	if !ok {
		return planner.Design{}, bad
	}
	if chunk == 0 {
		return planner.Design{}, fmt.Errorf("%w: --design %q: a colocated design needs --max-batch-tokens (-1 or > 0)", errUsage, s)
	}
	return planner.Design{Colocated: c, Chunk: chunk}, nil
}

// errUsage marks option errors (exit code 2).
var errUsage = errors.New("usage")

// Configs validates the options and builds one planner.Config per
// profile. Errors wrap errUsage for bad options.
func (o *Options) Configs() ([]*planner.Config, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
	}
	switch {
	case len(o.Profiles) == 0:
		return nil, bad("--profile is required (see `coordinator profiles`)")
	case o.Workload == "":
		return nil, bad("--workload is required (fixed:IN/OUT or a file)")
	case o.SLOTTFT <= 0 || o.SLOTPOT <= 0:
		return nil, bad("--slo-ttft and --slo-tpot are required and must be > 0")
	case o.Output != "table" && o.Output != "json":
		return nil, bad("--output %q: want table or json", o.Output)
	case (o.DecodeProfile != "" || o.ColocatedProfile != "") && len(o.Profiles) > 1:
		return nil, bad("--decode-profile and --colocated-profile work with one --profile only")
	case o.GPUBudget < 0:
		return nil, bad("--gpu-budget %d must be ≥ 0", o.GPUBudget)
	case o.CodecRatio < 0 || o.CodecMBps < 0:
		return nil, bad("--codec-ratio and --codec-mbps must be ≥ 0")
	case o.PrefixCacheTokens < planner.CacheAuto:
		return nil, bad("--prefix-cache-tokens %d: want ≥ 0, or -1 for the profile's KV memory", o.PrefixCacheTokens)
	case o.HostCacheTokens < 0:
		return nil, bad("--host-cache-tokens %d must be ≥ 0", o.HostCacheTokens)
	case o.HostCacheBytes < 0:
		return nil, bad("--host-cache-bytes %d must be ≥ 0", o.HostCacheBytes)
	case o.HostCacheBytes > 0 && o.HostCacheTokens > 0:
		return nil, bad("--host-cache-bytes and --host-cache-tokens both size the host tier: give one")
	case !(o.HostLinkGbps > 0) || math.IsInf(o.HostLinkGbps, 0):
		return nil, bad("--host-link-gbps %v must be finite and > 0", o.HostLinkGbps)
	case o.PrefixRouting != string(planner.RoutePrefix) && o.PrefixRouting != string(planner.RouteLeastLoaded):
		return nil, bad("--prefix-routing %q: want %s or %s", o.PrefixRouting, planner.RoutePrefix, planner.RouteLeastLoaded)
	}
	if auto, _ := codecpick.AutoName(o.Codec); auto && (o.CodecRatio > 0 || o.CodecMBps > 0) {
		return nil, bad("--codec-ratio and --codec-mbps describe one codec; --codec %s chooses among them", o.Codec)
	}
	cores := o.CodecCores
	if cores == 0 {
		cores = planner.DefaultCodecCores
	}
	cp, err := planner.LoadCodecProfile(o.CodecProfile)
	if err != nil {
		return nil, fmt.Errorf("%w: --codec-profile: %w", errUsage, err)
	}
	codec, err := cp.CodecFor(o.Codec, o.LinkGbps*1e9/8, cores)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	if o.CodecRatio > 0 {
		codec.Ratio = o.CodecRatio
	}
	if o.CodecMBps > 0 {
		codec.EncodeBytesPerSec, codec.DecodeBytesPerSec = o.CodecMBps*1e6, o.CodecMBps*1e6
	}
	switch {
	case o.CodecRatio > 0 && o.CodecMBps > 0:
		codec.Source = fmt.Sprintf("--codec-ratio %g and --codec-mbps %g per core", o.CodecRatio, o.CodecMBps)
	case o.CodecRatio > 0:
		codec.Source = fmt.Sprintf("ratio from --codec-ratio %g; speeds: %s", o.CodecRatio, codec.Source)
	case o.CodecMBps > 0:
		codec.Source = fmt.Sprintf("speeds from --codec-mbps %g per core; ratio: %s", o.CodecMBps, codec.Source)
	}
	cost, err := parseCost(o.GPUCost)
	if err != nil {
		return nil, fmt.Errorf("%w: --gpu-cost-per-hour: %w", errUsage, err)
	}
	w, err := planner.LoadWorkload(o.Workload, planner.LoadOptions{Samples: o.Samples, Seed: o.Seed})
	if err != nil {
		return nil, fmt.Errorf("%w: --workload: %w", errUsage, err)
	}
	var dec *perfmodel.Profile
	if o.DecodeProfile != "" {
		if dec, err = perfmodel.Resolve(o.DecodeProfile); err != nil {
			return nil, fmt.Errorf("%w: --decode-profile: %w", errUsage, err)
		}
	}
	var coloc *perfmodel.Profile
	if o.ColocatedProfile != "" {
		if coloc, err = perfmodel.Resolve(o.ColocatedProfile); err != nil {
			return nil, fmt.Errorf("%w: --colocated-profile: %w", errUsage, err)
		}
	}
	var cfgs []*planner.Config
	for _, name := range o.Profiles {
		p, err := perfmodel.Resolve(name)
		if err != nil {
			return nil, fmt.Errorf("%w: --profile: %w", errUsage, err)
		}
		if dec != nil && dec.Model != p.Model {
			return nil, bad("--decode-profile model %s differs from --profile model %s", dec.Model, p.Model)
		}
		if coloc != nil && coloc.Model != p.Model {
			return nil, bad("--colocated-profile model %s differs from --profile model %s", coloc.Model, p.Model)
		}
		c := &planner.Config{
			Prefill: p, Decode: dec, Colocated: coloc, Workload: w,
			SLO:             planner.SLO{TTFT: o.SLOTTFT, TPOT: o.SLOTPOT, Attainment: o.Attainment},
			Rate:            o.Rate,
			Burstiness:      o.Burstiness,
			LinkBytesPerSec: o.LinkGbps * 1e9 / 8,
			Codec:           codec,
			CodecCores:      o.CodecCores,
			Policy:          planner.Policy(o.Policy),
			Ingress:         o.Ingress,
			GPUBudget:       budget(o.GPUBudget, p),
			Limits:          o.Limits,
			Requests:        o.Requests,
			Seed:            o.Seed,
			Cache: planner.Cache{
				EngineTokens: o.PrefixCacheTokens, HostTokens: hostTokens(o, p),
				HostLinkBytesPerSec: o.HostLinkGbps * 1e9 / 8, Routing: planner.Routing(o.PrefixRouting),
			},
		}
		if c.GPUCostPerHour, err = cost.of(p.GPU); err != nil {
			return nil, fmt.Errorf("%w: --gpu-cost-per-hour: %w", errUsage, err)
		}
		if dec != nil {
			if c.DecodeGPUCostPerHour, err = cost.of(dec.GPU); err != nil {
				return nil, fmt.Errorf("%w: --gpu-cost-per-hour: %w", errUsage, err)
			}
		}
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
		cfgs = append(cfgs, c)
	}
	return cfgs, nil
}

// budget is the --gpu-budget for profile p: flag when > 0, else
// planner.DefaultBudget.
func budget(flag int, p *perfmodel.Profile) int {
	if flag > 0 {
		return flag
	}
	return planner.DefaultBudget(p)
}

// gpuCost is a price for every GPU, or per GPU name.
type gpuCost struct {
	all   float64
	byGPU map[string]float64
}

func parseCost(s string) (gpuCost, error) {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if !(v >= 0) {
			return gpuCost{}, fmt.Errorf("price %v must be ≥ 0", v)
		}
		return gpuCost{all: v}, nil
	}
	c := gpuCost{byGPU: map[string]float64{}}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if !ok || err != nil || !(f >= 0) {
			return gpuCost{}, fmt.Errorf("%q: want a price or GPU=PRICE pairs", kv)
		}
		c.byGPU[strings.TrimSpace(k)] = f
	}
	return c, nil
}

func (c gpuCost) of(gpu string) (float64, error) {
	if c.byGPU == nil {
		return c.all, nil
	}
	v, ok := c.byGPU[gpu]
	if !ok {
		return 0, fmt.Errorf("no price for GPU %s", gpu)
	}
	return v, nil
}

// Run is `coordinator plan ARGS`: it parses the flags, plans every
// profile, writes the table or JSON to stdout (and the PNG when asked) and
// the timing to stderr. Exit codes: 0 planned; 1 no design meets the SLO
// (the plan is still written), a write failed or ctx was cancelled; 2 bad
// flags or inputs.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := DefaultOptions()
	fs := flag.NewFlagSet("coordinator plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: coordinator plan --profile GPU/MODEL/tpN --workload SPEC --slo-ttft D --slo-tpot D [flags]\n\n"+
			"Sizes the prefill and decode pools for the highest goodput per GPU (or the fewest GPUs at\n"+
			"--rate) by simulating the disaggregated and the colocated system on the performance model,\n"+
			"with the KV transfer between pools as its own term of the TTFT budget. It prints the\n"+
			"replicas, goodput per GPU, $/1k tokens and predicted SLO attainment of both designs.\n"+
			"`coordinator profiles` lists the profiles.\n\n"+
			"Examples:\n"+
			"  coordinator plan --profile h100/llama-3-8b/tp1 --workload fixed:512/64 --slo-ttft 500ms --slo-tpot 50ms --rate 20\n"+
			"  coordinator plan --profile a100-80g/opt-13b/tp1,h100/llama-3-8b/tp1 --gpu-cost-per-hour a100-80g=1.9,h100=3.5 \\\n"+
			"    --workload trace.csv --slo-ttft 250ms --slo-tpot 100ms --codec zstd --link-gbps 25 --plot plan.png\n"+
			"  coordinator plan --profile h100/llama-3-8b/tp1 --workload fixed:512/64 --slo-ttft 500ms --slo-tpot 50ms \\\n"+
			"    --design 2P+1D --rate 10\n"+
			"  coordinator plan --profile h100/llama-3-8b/tp1 --workload day.csv --slo-ttft 2s --slo-tpot 100ms --window 1h\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := cliflags.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	for _, r := range cliflags.RenamedGiven(fs) {
		fmt.Fprintf(stderr, "coordinator plan: %s\n", r.Deprecation())
	}
	if o.PolicyFile != "" || len(o.ModelProfiles) > 0 || len(o.ModelRates) > 0 {
		return runTiers(ctx, o, stdout, stderr)
	}
	if o.Window != 0 {
		return planWindows(ctx, o, stdout, stderr)
	}
	if o.GPUs != 0 {
		fmt.Fprintf(stderr, "coordinator plan: --gpus fixes the pool of a --window plan: give --window, or --gpu-budget for the most GPUs a design may use\n")
		return 2
	}
	cfgs, err := o.Configs()
	if err != nil {
		fmt.Fprintf(stderr, "coordinator plan: %v\n", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		return 2
	}
	if o.Design != "" {
		return evaluate(o, cfgs, stdout, stderr)
	}
	start := time.Now()
	var plans []*planner.Plan
	code := 0
	sims := 0
	for _, c := range cfgs {
		p, err := planner.Run(ctx, c)
		switch {
		case errors.Is(err, planner.ErrInfeasible):
			fmt.Fprintf(stderr, "coordinator plan: %s: %v\n", c.Prefill.Name, err)
			code = 1
		case err != nil:
			fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
			return 1
		}
		sims += p.Simulations
		if o.CacheSweep {
			rows, err := planner.SweepCache(ctx, c)
			if err != nil {
				fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
				return 1
			}
			p.CacheSweep = rows
		}
		plans = append(plans, p)
		for _, w := range p.Warnings {
			fmt.Fprintf(stderr, "coordinator plan: %s: warning: %s\n", c.Prefill.Name, w)
		}
	}
	elapsed := time.Since(start)
	if o.Output == "json" {
		err = planner.WriteJSON(stdout, plans...)
	} else {
		err = planner.WriteTable(stdout, plans...)
	}
	if err != nil {
		fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
		return 1
	}
	if o.Plot != "" {
		if err := writePNG(o.Plot, plans); err != nil {
			fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "coordinator plan: %d profile(s), %d simulations in %.2f s\n", len(plans), sims, elapsed.Seconds())
	return code
}

// evaluate is Run with --design: one design at --rate, no search.
func evaluate(o Options, cfgs []*planner.Config, stdout, stderr io.Writer) int {
	usage := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "coordinator plan: "+format+"\n", args...)
		return 2
	}
	switch {
	case len(cfgs) != 1:
		return usage("--design works with one --profile only")
	case !(o.Rate > 0):
		return usage("--design needs --rate > 0")
	case o.Plot != "":
		return usage("--design draws no plot; drop --plot")
	}
	d, err := ParseDesign(o.Design, o.Limits.ChunkTokens)
	if err != nil {
		return usage("%v", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
	}
	e, err := planner.Evaluate(cfgs[0], d)
	if err != nil {
		return usage("%v", err)
	}
	for _, w := range e.Warnings {
		fmt.Fprintf(stderr, "coordinator plan: warning: %s\n", w)
	}
	if o.Output == "json" {
		err = planner.WriteEvaluationJSON(stdout, e)
	} else {
		err = planner.WriteEvaluationTable(stdout, e)
	}
	if err != nil {
		fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
		return 1
	}
	return 0
}

// Main is Run without cancellation, for callers without a context.
func Main(args []string, stdout, stderr io.Writer) int {
	return Run(context.Background(), args, stdout, stderr)
}

func writePNG(name string, plans []*planner.Plan) (err error) {
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("plot: %w", cerr)
		}
	}()
	return planner.WritePNG(f, plans...)
}

// runTiers plans each served model of the --policy tiers apart, from its
// own profile and rate, and prints one plan per model (table output), in
// the models' order.
func runTiers(ctx context.Context, o Options, stdout, stderr io.Writer) int {
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "coordinator plan: "+format+"\n", a...)
		return 2
	}
	switch {
	case o.PolicyFile == "":
		return usage("--model-profile and --model-rate plan the models of a policy's tiers: give --policy")
	case len(o.Profiles) > 0 || o.Rate != 0 || o.DecodeProfile != "" || o.ColocatedProfile != "":
		return usage("with --policy each tier model's profile and rate are --model-profile and --model-rate, not --profile, --decode-profile, --colocated-profile or --rate")
	case o.Design != "" || o.Plot != "" || o.Window != 0 || o.GPUs != 0:
		return usage("--design, --plot, --window and --gpus plan one profile: not with --policy")
	case o.Output != "table":
		return usage("--output %s: with --policy the plans are printed as tables, one per model", o.Output)
	}
	pol, err := config.Load(o.PolicyFile)
	if err != nil {
		return usage("--policy: %v", err)
	}
	var models []string
	tierOf := map[string][]string{}
	for _, name := range slices.Sorted(maps.Keys(pol.Tiers)) {
		for _, m := range pol.Tiers[name].Models {
			if !slices.Contains(models, m) {
				models = append(models, m)
			}
			tierOf[m] = append(tierOf[m], name)
		}
	}
	if len(models) == 0 {
		return usage("--policy %s names no tiers", o.PolicyFile)
	}
	for _, m := range slices.Sorted(maps.Keys(o.ModelProfiles)) {
		if !slices.Contains(models, m) {
			return usage("--model-profile %s: no tier of the policy serves model %s", m, m)
		}
	}
	for _, m := range slices.Sorted(maps.Keys(o.ModelRates)) {
		if !slices.Contains(models, m) {
			return usage("--model-rate %s: no tier of the policy serves model %s", m, m)
		}
	}
	slices.Sort(models)
	code := 0
	for _, m := range models {
		prof, ok := o.ModelProfiles[m]
		if !ok {
			return usage("model %s of the policy's tiers has no --model-profile %s=PROFILE", m, m)
		}
		mo := o
		mo.Profiles, mo.Rate = []string{prof}, o.ModelRates[m]
		cfgs, err := mo.Configs()
		if err != nil {
			return usage("model %s: %v", m, strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		}
		p, err := planner.Run(ctx, cfgs[0])
		switch {
		case errors.Is(err, planner.ErrInfeasible):
			fmt.Fprintf(stderr, "coordinator plan: model %s (%s): %v\n", m, prof, err)
			code = 1
		case err != nil:
			fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
			return 1
		}
		if o.CacheSweep {
			if p.CacheSweep, err = planner.SweepCache(ctx, cfgs[0]); err != nil {
				fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
				return 1
			}
		}
		fmt.Fprintf(stdout, "== model %s (tier %s), %s, rate %s ==\n", m, strings.Join(tierOf[m], ", "), prof, rateText(mo.Rate))
		if err := planner.WriteTable(stdout, p); err != nil {
			fmt.Fprintf(stderr, "coordinator plan: %v\n", err)
			return 1
		}
		for _, w := range p.Warnings {
			fmt.Fprintf(stderr, "coordinator plan: model %s: warning: %s\n", m, w)
		}
	}
	return code
}

// rateText describes a planned rate: req/s, or the search for the
// highest goodput per GPU.
func rateText(r float64) string {
	if r == 0 {
		return "highest goodput per GPU"
	}
	return strconv.FormatFloat(r, 'g', -1, 64) + " req/s"
}
