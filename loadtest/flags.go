package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/pkg/workload"
)

// benchOptions are the flags shared by run, sweep, compare and regress.
// Names and defaults follow `vllm bench serve` where they overlap.
type benchOptions struct {
	// Target.
	BaseURL, Host string
	Port          int
	Endpoint      string
	Backend       string
	Model         string
	APIKey        string
	ReadyTimeout  float64 // seconds; 0: no check
	// Requests.
	IgnoreEOS      bool
	Temperature    float64
	ExtraBody      string
	NoStream       bool
	RequestTimeout time.Duration
	// Workload.
	DatasetName, DatasetPath string
	NumPrompts               int
	Tokenizer, PromptFormat  string
	TokenIDRange             string
	RandomInputLen           int
	RandomOutputLen          int
	RandomRangeRatio         float64
	RandomPrefixLen          int
	ShareGPTOutputLen        int
	InputLenDist             string
	OutputLenDist            string
	TraceReplay              bool
	TraceTimeScale           float64
	TraceSkip                int
	MooncakeBlockSize        int
	// RepeatFraction in [0, 1) makes that share of the requests exact
	// repeats of earlier ones (seeded by Seed): a response cache workload.
	RepeatFraction float64
	// SamePrompts sends the same prompt content on every probe of a sweep
	// or comparison instead of content drawn per probe (probeSeed).
	SamePrompts bool
	// Arrivals.
	RequestRate    float64
	Burstiness     float64
	MaxConcurrency int
	Seed           uint64
	// Metrics.
	Goodput           string
	PercentileMetrics string
	MetricPercentiles string
	TimeScale         float64
	// Output.
	SaveResult     bool
	SaveDetailed   bool
	ResultDir      string
	ResultFilename string
	PlotDir        string
	NoPlots        bool
	Label          string
	Metadata       string
	Quiet          bool
	DisableTqdm    bool

	// Parsed by complete.
	slo         metrics.SLO
	percentiles []float64
	metricNames []string
	wl          workload.Options
	loaded      *workload.Workload // by preflight
	extra       map[string]any
	meta        map[string]string
}

func defaultBenchOptions() *benchOptions {
	return &benchOptions{
		Host:              "127.0.0.1",
		Port:              8080,
		Endpoint:          "",
		Backend:           "openai",
		APIKey:            os.Getenv("OPENAI_API_KEY"),
		IgnoreEOS:         true,
		RequestTimeout:    10 * time.Minute,
		DatasetName:       "random",
		NumPrompts:        1000,
		Tokenizer:         "bytes",
		PromptFormat:      "text",
		RandomInputLen:    1024,
		RandomOutputLen:   128,
		TraceTimeScale:    1,
		MooncakeBlockSize: 512,
		RequestRate:       math.Inf(1),
		Burstiness:        1,
		PercentileMetrics: "ttft,ttfo,tpot,itl,e2el",
		MetricPercentiles: "50,90,95,99",
		TimeScale:         1,
		ResultDir:         ".",
	}
}

// addFlags registers the shared flags on fs.
func (o *benchOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.BaseURL, "base-url", o.BaseURL, "server root URL, e.g. http://127.0.0.1:8080 (overrides --host and --port)")
	fs.StringVar(&o.Host, "host", o.Host, "server host (when --base-url is not given)")
	fs.IntVar(&o.Port, "port", o.Port, "server port (when --base-url is not given)")
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "API path: /v1/completions or /v1/chat/completions (default by --backend)")
	fs.StringVar(&o.Backend, "backend", o.Backend, "openai (/v1/completions) or openai-chat (/v1/chat/completions)")
	fs.StringVar(&o.Model, "model", o.Model, "model name to send (empty: the first of GET /v1/models)")
	fs.StringVar(&o.APIKey, "api-key", o.APIKey, "bearer token (default: $OPENAI_API_KEY)")
	fs.Float64Var(&o.ReadyTimeout, "ready-check-timeout-sec", o.ReadyTimeout, "wait up to this many seconds for GET /v1/models to answer before starting (0: no check)")
	fs.BoolVar(&o.IgnoreEOS, "ignore-eos", o.IgnoreEOS, "send ignore_eos so outputs run to max_tokens (exact output lengths on vLLM, SGLang, pdserve)")
	fs.Float64Var(&o.Temperature, "temperature", o.Temperature, "sampling temperature (0: greedy)")
	fs.StringVar(&o.ExtraBody, "extra-body", o.ExtraBody, "JSON object merged into every request body")
	fs.BoolVar(&o.NoStream, "disable-stream", o.NoStream, "ask for non-streaming responses (TTFT is then the whole latency)")
	fs.DurationVar(&o.RequestTimeout, "request-timeout", o.RequestTimeout, "per-request time limit (0: none)")

	fs.StringVar(&o.DatasetName, "dataset-name", o.DatasetName, "random, sharegpt, azure, mooncake or dist")
	fs.StringVar(&o.DatasetPath, "dataset-path", o.DatasetPath, "dataset file (sharegpt JSON, azure CSV, mooncake JSONL)")
	fs.IntVar(&o.NumPrompts, "num-prompts", o.NumPrompts, "number of requests (traces: the first N rows after --trace-skip; 0: all rows)")
	fs.StringVar(&o.Tokenizer, "tokenizer", o.Tokenizer, "token counting: bytes (pdserve's byte-level models, exact) or approx (BPE servers: one common word per token, ceil(bytes/4) for real text)")
	fs.StringVar(&o.PromptFormat, "prompt-format", o.PromptFormat, "text, or tokens (token-id arrays: exact lengths on pdserve and vLLM; completions endpoint only)")
	fs.StringVar(&o.TokenIDRange, "token-id-range", o.TokenIDRange, "LO:HI: token ids of synthetic token prompts on --tokenizer approx (default 1000:10000)")
	fs.IntVar(&o.RandomInputLen, "random-input-len", o.RandomInputLen, "random dataset: mean prompt tokens (after the prefix)")
	fs.IntVar(&o.RandomOutputLen, "random-output-len", o.RandomOutputLen, "random dataset: mean output tokens")
	fs.Float64Var(&o.RandomRangeRatio, "random-range-ratio", o.RandomRangeRatio, "random dataset: lengths uniform in [len·(1−r), len·(1+r)], r in [0, 1)")
	fs.IntVar(&o.RandomPrefixLen, "random-prefix-len", o.RandomPrefixLen, "random and dist datasets: tokens of a prefix shared by every prompt (and every probe), before its own tokens")
	fs.IntVar(&o.ShareGPTOutputLen, "sharegpt-output-len", o.ShareGPTOutputLen, "sharegpt: fixed output length (0: the reference completion's length)")
	fs.StringVar(&o.InputLenDist, "input-len-dist", o.InputLenDist, "dist dataset: prompt length distribution, e.g. lognormal:mean=755,std=400,max=4096")
	fs.StringVar(&o.OutputLenDist, "output-len-dist", o.OutputLenDist, "dist dataset: output length distribution, e.g. exponential:mean=200,max=2048")
	fs.Float64Var(&o.RepeatFraction, "repeat-fraction", o.RepeatFraction, "share of requests in [0, 1) sent as exact repeats of an earlier one (by --seed), for a response cache; cached only with --temperature 0 or a seed in --extra-body")
	fs.BoolVar(&o.TraceReplay, "trace-replay", o.TraceReplay, "azure/mooncake: send at the trace's timestamps instead of --request-rate")
	fs.Float64Var(&o.TraceTimeScale, "trace-time-scale", o.TraceTimeScale, "with --trace-replay: multiply trace gaps by this (0.5 = twice as fast)")
	fs.IntVar(&o.TraceSkip, "trace-skip", o.TraceSkip, "azure/mooncake: skip this many rows from the start of the trace")
	fs.IntVar(&o.MooncakeBlockSize, "mooncake-block-size", o.MooncakeBlockSize, "mooncake: tokens per hash block")

	fs.Float64Var(&o.RequestRate, "request-rate", o.RequestRate, "requests per second (inf: all at once; with --max-concurrency, a fixed concurrency)")
	fs.Float64Var(&o.Burstiness, "burstiness", o.Burstiness, "gamma shape of inter-arrival times: 1 = Poisson, < 1 burstier, > 1 more regular")
	fs.IntVar(&o.MaxConcurrency, "max-concurrency", o.MaxConcurrency, "most requests in flight (0: no limit)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed for lengths, prompt content and arrivals (sweep, compare: the content of probe k > 0 is drawn from a seed derived from it and k)")
	fs.BoolVar(&o.SamePrompts, "same-prompts", o.SamePrompts, "sweep, compare: send the same prompts on every probe, so that probes after the first hit a prefix cache the earlier ones warmed (default: each probe its own content, the same lengths and arrivals)")

	fs.StringVar(&o.Goodput, "goodput", o.Goodput, `SLOs of a good request, "KEY:MS ..." with keys ttft, tpot, e2el (e.g. --goodput ttft:300 tpot:50)`)
	fs.StringVar(&o.PercentileMetrics, "percentile-metrics", o.PercentileMetrics, "metrics to report: comma-separated ttft, ttfo, tpot, itl, e2el (ttfo only when reasoning is streamed)")
	fs.StringVar(&o.MetricPercentiles, "metric-percentiles", o.MetricPercentiles, "percentiles to report, comma-separated")
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "the server's performance-model time scale (wall = modelled × scale): arrivals are stretched by it and measured times divided by it")

	fs.BoolVar(&o.SaveResult, "save-result", o.SaveResult, "write the result JSON (and plots) to --result-dir")
	fs.BoolVar(&o.SaveDetailed, "save-detailed", o.SaveDetailed, "include per-request arrays in the result JSON")
	fs.StringVar(&o.ResultDir, "result-dir", o.ResultDir, "directory for results and plots")
	fs.StringVar(&o.ResultFilename, "result-filename", o.ResultFilename, "result file name under --result-dir, or an absolute path kept as it is (default: vLLM's BACKEND-RATEqps-MODEL-DATE.json)")
	fs.StringVar(&o.PlotDir, "plot-dir", o.PlotDir, "directory for PNG plots (default: --result-dir with --save-result, else none)")
	fs.BoolVar(&o.NoPlots, "no-plots", o.NoPlots, "write no PNG plots")
	fs.StringVar(&o.Label, "label", o.Label, "label of the run in results and file names")
	fs.StringVar(&o.Metadata, "metadata", o.Metadata, `KEY=VALUE pairs stored in the result ("--metadata a=1 b=2")`)
	fs.BoolVar(&o.Quiet, "quiet", o.Quiet, "no progress bar")
	fs.BoolVar(&o.DisableTqdm, "disable-tqdm", o.DisableTqdm, "same as --quiet (vLLM's name)")
}

// nargsFlags take several space-separated values, as in vLLM.
var nargsFlags = map[string]bool{"goodput": true, "metadata": true}

// joinNargs rewrites "--goodput a b --x" into "--goodput=a b --x" so the
// standard flag package can parse vLLM's multi-value flags.
func joinNargs(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name := strings.TrimLeft(a, "-")
		if strings.HasPrefix(a, "-") && !strings.Contains(name, "=") && nargsFlags[name] {
			var vals []string
			for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				vals = append(vals, args[i])
			}
			out = append(out, "--"+name+"="+strings.Join(vals, " "))
			continue
		}
		out = append(out, a)
	}
	return out
}

var errUsage = errors.New("usage")

// complete parses the derived settings and reports every bad one; when
// they are good, it checks the inputs they name (preflight).
func (o *benchOptions) complete() error {
	var errs []error
	bad := func(err error) { errs = append(errs, err) }
	if o.BaseURL == "" {
		o.BaseURL = fmt.Sprintf("http://%s:%d", o.Host, o.Port)
	}
	o.BaseURL = strings.TrimRight(o.BaseURL, "/")
	switch o.Backend {
	case "openai", "vllm", "sglang", "pdserve":
		if o.Endpoint == "" {
			o.Endpoint = "/v1/completions"
		}
	case "openai-chat":
		if o.Endpoint == "" {
			o.Endpoint = "/v1/chat/completions"
		}
	default:
		bad(fmt.Errorf("--backend %q: want openai or openai-chat", o.Backend))
	}
	if o.DisableTqdm {
		o.Quiet = true
	}
	var err error
	if o.slo, err = metrics.ParseGoodput(o.Goodput); err != nil {
		bad(err)
	}
	if o.percentiles, err = metrics.ParsePercentiles(o.MetricPercentiles); err != nil {
		bad(err)
	}
	if o.metricNames, err = metrics.ParseMetricNames(o.PercentileMetrics); err != nil {
		bad(err)
	}
	if o.ExtraBody != "" {
		if err := json.Unmarshal([]byte(o.ExtraBody), &o.extra); err != nil {
			bad(fmt.Errorf("--extra-body: not a JSON object: %v", err))
		}
	}
	o.meta = map[string]string{}
	for _, kv := range strings.Fields(o.Metadata) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			bad(fmt.Errorf("--metadata %q: want KEY=VALUE", kv))
			continue
		}
		o.meta[k] = v
	}
	switch {
	case math.IsNaN(o.RequestRate) || o.RequestRate <= 0:
		bad(fmt.Errorf("--request-rate %v: want > 0 or inf", o.RequestRate))
	case !(o.Burstiness > 0) || math.IsInf(o.Burstiness, 0):
		bad(fmt.Errorf("--burstiness %v: want > 0", o.Burstiness))
	case o.MaxConcurrency < 0:
		bad(fmt.Errorf("--max-concurrency %d: want ≥ 0", o.MaxConcurrency))
	case !(o.TimeScale > 0) || math.IsInf(o.TimeScale, 0):
		bad(fmt.Errorf("--time-scale %v: want > 0", o.TimeScale))
	case !(o.TraceTimeScale > 0) || math.IsInf(o.TraceTimeScale, 0):
		bad(fmt.Errorf("--trace-time-scale %v: want > 0", o.TraceTimeScale))
	}
	if o.TraceReplay && o.DatasetName != "azure" && o.DatasetName != "mooncake" {
		bad(fmt.Errorf("--trace-replay needs --dataset-name azure or mooncake"))
	}
	if err := o.workloadOptions(); err != nil {
		bad(err)
	}
	if strings.HasSuffix(strings.TrimRight(o.Endpoint, "/"), "chat/completions") && o.PromptFormat == "tokens" {
		bad(fmt.Errorf("--prompt-format tokens needs the completions endpoint (chat takes text)"))
	}
	if !(o.RepeatFraction >= 0 && o.RepeatFraction < 1) {
		bad(fmt.Errorf("--repeat-fraction %v must lie in [0, 1)", o.RepeatFraction))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return o.preflight()
}

func (o *benchOptions) workloadOptions() error {
	tok, err := workload.ParseTokenizer(o.Tokenizer)
	if err != nil {
		return err
	}
	format, err := workload.ParseFormat(o.PromptFormat)
	if err != nil {
		return err
	}
	s := workload.Synth{Format: format, Tokenizer: tok}
	if o.TokenIDRange != "" {
		lo, hi, ok := strings.Cut(o.TokenIDRange, ":")
		l, err1 := strconv.ParseInt(lo, 10, 32)
		h, err2 := strconv.ParseInt(hi, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("--token-id-range %q: want LO:HI", o.TokenIDRange)
		}
		s.IDLo, s.IDHi = int32(l), int32(h)
	}
	o.wl = workload.Options{
		Name: o.DatasetName, Path: o.DatasetPath, NumPrompts: o.NumPrompts, Seed: o.Seed, Synth: s,
		Random: workload.RandomOptions{
			InputLen: o.RandomInputLen, OutputLen: o.RandomOutputLen,
			RangeRatio: o.RandomRangeRatio, PrefixLen: o.RandomPrefixLen,
		},
		ShareGPT: workload.ShareGPTOptions{OutputLen: o.ShareGPTOutputLen},
		Trace:    workload.TraceOptions{Skip: o.TraceSkip, BlockSize: o.MooncakeBlockSize},
	}
	switch {
	case o.RandomPrefixLen < 0:
		return fmt.Errorf("--random-prefix-len %d: want ≥ 0", o.RandomPrefixLen)
	case o.RandomPrefixLen > 0 && o.DatasetName != "random" && o.DatasetName != "dist":
		return fmt.Errorf("--random-prefix-len: only the random and dist datasets take a shared prefix (%s has its own prompts)", o.DatasetName)
	}
	if o.DatasetName == "dist" {
		o.wl.DistPrefixLen = o.RandomPrefixLen
		if o.wl.InputDist, err = workload.ParseDist(o.InputLenDist); err != nil {
			return err
		}
		if o.wl.OutputDist, err = workload.ParseDist(o.OutputLenDist); err != nil {
			return err
		}
	}
	return nil
}
