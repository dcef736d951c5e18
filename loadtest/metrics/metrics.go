package metrics

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/loadtest/client"
)

// ErrBadSpec reports an unparsable --goodput, --percentile-metrics or
// --metric-percentiles value.
var ErrBadSpec = errors.New("metrics: bad specification")

// SLO holds per-request latency objectives; a zero field is not set.
type SLO struct {
	TTFT, TPOT, E2EL time.Duration
}

// Set reports whether any objective is set.
func (s SLO) Set() bool { return s.TTFT > 0 || s.TPOT > 0 || s.E2EL > 0 }

// String returns the --goodput spelling, e.g. "ttft:300 tpot:50".
func (s SLO) String() string {
	var parts []string
	for _, kv := range []struct {
		k string
		v time.Duration
	}{{"ttft", s.TTFT}, {"tpot", s.TPOT}, {"e2el", s.E2EL}} {
		if kv.v > 0 {
			parts = append(parts, kv.k+":"+strconv.FormatFloat(ms(kv.v), 'g', -1, 64))
		}
	}
	return strings.Join(parts, " ")
}

// Map returns the objectives in milliseconds by name ("ttft", "tpot",
// "e2el"), only those set.
func (s SLO) Map() map[string]float64 {
	m := map[string]float64{}
	if s.TTFT > 0 {
		m["ttft"] = ms(s.TTFT)
	}
	if s.TPOT > 0 {
		m["tpot"] = ms(s.TPOT)
	}
	if s.E2EL > 0 {
		m["e2el"] = ms(s.E2EL)
	}
	return m
}

// ParseGoodput parses vLLM's --goodput values: "KEY:MS" items (keys ttft,
// tpot, e2el; milliseconds > 0), given as separate arguments or separated by
// spaces or commas.
func ParseGoodput(items ...string) (SLO, error) {
	var s SLO
	for _, it := range items {
		for _, f := range strings.FieldsFunc(it, func(r rune) bool { return r == ' ' || r == ',' }) {
			k, v, ok := strings.Cut(f, ":")
			x, err := strconv.ParseFloat(v, 64)
			if !ok || err != nil || !(x > 0) || math.IsInf(x, 0) {
				return SLO{}, fmt.Errorf("%w: goodput %q: want KEY:MILLISECONDS with a positive number", ErrBadSpec, f)
			}
			d := time.Duration(x * float64(time.Millisecond))
			switch strings.ToLower(k) {
			case "ttft":
				s.TTFT = d
			case "tpot":
				s.TPOT = d
			case "e2el":
				s.E2EL = d
			default:
				return SLO{}, fmt.Errorf("%w: goodput %q: key %q is not ttft, tpot or e2el", ErrBadSpec, f, k)
			}
		}
	}
	return s, nil
}

// TPOT returns a completed request's time per output token, excluding the
// first: (E2EL − TTFT) / (output tokens − 1), and false when it has one
// output token or fewer.
func TPOT(o *client.Outcome) (time.Duration, bool) {
	if o.OutputTokens <= 1 {
		return 0, false
	}
	return (o.Latency - o.TTFT) / time.Duration(o.OutputTokens-1), true
}

// Good reports whether o completed and meets every objective set (TPOT of a
// one-token request counts as 0).
func (s SLO) Good(o *client.Outcome) bool {
	if !o.Success {
		return false
	}
	tpot, _ := TPOT(o)
	return (s.TTFT == 0 || o.TTFT <= s.TTFT) &&
		(s.TPOT == 0 || tpot <= s.TPOT) &&
		(s.E2EL == 0 || o.Latency <= s.E2EL)
}

// missed reports, for each objective set, whether completed o missed it.
func (s SLO) missed(o *client.Outcome) map[string]bool {
	tpot, _ := TPOT(o)
	m := map[string]bool{}
	if s.TTFT > 0 {
		m["ttft"] = o.TTFT > s.TTFT
	}
	if s.TPOT > 0 {
		m["tpot"] = tpot > s.TPOT
	}
	if s.E2EL > 0 {
		m["e2el"] = o.Latency > s.E2EL
	}
	return m
}

// AllMetrics are the client-side metric names, in report order.
var AllMetrics = []string{"ttft", "ttfo", "tpot", "itl", "e2el"}

// ParseMetricNames parses --percentile-metrics: a comma-separated subset of
// ttft, ttfo, tpot, itl, e2el.
func ParseMetricNames(spec string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(AllMetrics, f) {
			return nil, fmt.Errorf("%w: metric %q: want ttft, ttfo, tpot, itl or e2el", ErrBadSpec, f)
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no metric in %q", ErrBadSpec, spec)
	}
	return out, nil
}

// ParsePercentiles parses --metric-percentiles: comma-separated numbers in
// (0, 100], e.g. "50,90,95,99" or "99.9".
func ParsePercentiles(spec string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := strconv.ParseFloat(f, 64)
		if err != nil || !(p > 0 && p <= 100) {
			return nil, fmt.Errorf("%w: percentile %q: want a number in (0, 100]", ErrBadSpec, f)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no percentile in %q", ErrBadSpec, spec)
	}
	return out, nil
}

// PercentileName returns vLLM's key fragment for p: "p99", "p99.9".
func PercentileName(p float64) string {
	return "p" + strconv.FormatFloat(p, 'f', -1, 64)
}

// Stats summarises a set of values in milliseconds.
type Stats struct {
	N           int
	Mean        float64
	Median      float64
	Std         float64 // population standard deviation (numpy's np.std)
	Percentiles []Percentile
}

// Percentile is one percentile's value, in milliseconds.
type Percentile struct {
	P     float64 // in (0, 100]
	Value float64
}

// Get returns the percentile p's value, or false when it was not computed.
func (s Stats) Get(p float64) (float64, bool) {
	for _, q := range s.Percentiles {
		if q.P == p {
			return q.Value, true
		}
	}
	return 0, false
}

// Summarize computes Stats of xs (milliseconds); xs is not modified.
func Summarize(xs []float64, ps []float64) Stats {
	s := Stats{N: len(xs)}
	sorted := slices.Clone(xs)
	sort.Float64s(sorted)
	if len(sorted) > 0 {
		var sum float64
		for _, x := range sorted {
			sum += x
		}
		s.Mean = sum / float64(len(sorted))
		var sq float64
		for _, x := range sorted {
			sq += (x - s.Mean) * (x - s.Mean)
		}
		s.Std = math.Sqrt(sq / float64(len(sorted)))
	}
	s.Median = Quantile(sorted, 50)
	for _, p := range ps {
		s.Percentiles = append(s.Percentiles, Percentile{P: p, Value: Quantile(sorted, p)})
	}
	return s
}

// Quantile returns the p-th percentile (0–100) of sorted values by linear
// interpolation between closest ranks (numpy's default), 0 when empty.
func Quantile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	pos := p / 100 * float64(n-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, n-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// Options select what Compute reports.
type Options struct {
	// Metrics get mean/median/std/percentiles; nil means all of AllMetrics
	// (ttfo only when a stream carried reasoning).
	Metrics []string
	// Percentiles to report; nil means 50, 90, 95, 99.
	Percentiles []float64
	// SLO decides which requests are good.
	SLO SLO
}

// DefaultPercentiles are reported when none are asked for.
var DefaultPercentiles = []float64{50, 90, 95, 99}

// Summary is a benchmark's result.
type Summary struct {
	Total     int // requests sent
	Completed int
	Failed    int
	Good      int           // completed and meeting every SLO (= Completed without SLOs)
	Duration  time.Duration // the benchmark's wall time
	// Token counts: prompt tokens of completed requests (from the
	// workload) and their output tokens.
	TotalInput, TotalOutput int
	// Rates per second of Duration.
	RequestThroughput    float64
	RequestGoodput       float64 // meaningful when SLO.Set()
	OutputThroughput     float64
	TotalTokenThroughput float64
	// Attainment is Good / Total (0 when nothing was sent).
	Attainment float64
	// MaxOutputTokensPerS and MaxConcurrentRequests are vLLM's peak figures
	// over one-second buckets (one token per event).
	MaxOutputTokensPerS   float64
	MaxConcurrentRequests int
	// Metrics holds each reported metric's Stats; MetricOrder lists the
	// names in report order.
	Metrics     map[string]Stats
	MetricOrder []string
	Percentiles []float64
	SLO         SLO
	// Reasoning counts completed requests whose stream carried reasoning.
	Reasoning int
	// Budget aggregates the server's per-request budget objects; nil when
	// none arrived.
	Budget *Budget
	// Failures counts the failed requests by reason (FailureReason), most
	// frequent first (ties by reason); nil when none failed.
	Failures []Failure
	// Misses counts the completed requests that missed each SLO set, by
	// name ("ttft", "tpot", "e2el"); a request may miss several.
	Misses map[string]int
}

// Failure is one reason requests failed for and how many did.
type Failure struct {
	Reason string // FailureReason
	Kind   string // client.Outcome.FailKind
	Status int    // HTTP status, 0 when no response came
	Code   string // the OpenAI error's code, else its type, else ""
	Count  int
}

// Short names the failure in a few words: "HTTP 429 overloaded",
// "timeout", "connection".
func (f Failure) Short() string {
	if f.Kind != client.FailHTTP {
		return f.Kind
	}
	if f.Code != "" {
		return fmt.Sprintf("HTTP %d %s", f.Status, f.Code)
	}
	return fmt.Sprintf("HTTP %d", f.Status)
}

// TopFailure names the most frequent failure ("HTTP 429 overloaded", with
// " and others" when there are more), "" when none failed.
func (s Summary) TopFailure() string {
	if len(s.Failures) == 0 {
		return ""
	}
	t := s.Failures[0].Short()
	for _, f := range s.Failures[1:] {
		if f.Short() != s.Failures[0].Short() {
			return t + " and others"
		}
	}
	return t
}

// FailureCount returns the failures whose HTTP status is status (0: those
// without a response).
func (s Summary) FailureCount(status int) int {
	n := 0
	for _, f := range s.Failures {
		if f.Status == status {
			n += f.Count
		}
	}
	return n
}

var (
	digitsRE = regexp.MustCompile(`[0-9]+`)
	idRE     = regexp.MustCompile(`(cmpl|chatcmpl|req)-[A-Za-z0-9_-]+`)
)

// maskMessage makes a message a class: request ids and numbers masked
// ("N"), at most 160 bytes.
func maskMessage(m string) string {
	m = idRE.ReplaceAllString(m, "$1-ID")
	m = digitsRE.ReplaceAllString(m, "N")
	m = strings.Join(strings.Fields(m), " ")
	if len(m) > 160 {
		m = m[:160] + "…"
	}
	return m
}

// connClass names a transport error by its cause.
func connClass(e string) string {
	for _, c := range []string{"connection refused", "connection reset by peer", "broken pipe", "unexpected EOF", "EOF", "no such host", "TLS handshake"} {
		if strings.Contains(e, c) {
			return c
		}
	}
	return "other"
}

// FailureReason returns the class of a failed outcome, to count failures
// by: the HTTP status with the OpenAI error's type/code and message
// (numbers masked), e.g. "HTTP 429 rate_limit_error/overloaded: No decode
// worker has free KV cache for N tokens now; retry later."; "timeout
// before the first token" or "timeout mid-stream"; "connection: connection
// refused"; "stream error event server_error: …"; "stream broken: …";
// "no token in the response"; "canceled"; "" for a success.
func FailureReason(o *client.Outcome) string {
	if o.Success {
		return ""
	}
	api := strings.Trim(o.ErrorType+"/"+o.ErrorCode, "/")
	msg := maskMessage(o.ErrorMessage)
	switch o.FailKind {
	case client.FailHTTP:
		r := fmt.Sprintf("HTTP %d", o.Status)
		if api != "" {
			r += " " + api
		}
		if msg == "" {
			body, _ := strings.CutPrefix(o.Error, fmt.Sprintf("HTTP %d: ", o.Status))
			msg = maskMessage(body)
		}
		if msg != "" {
			r += ": " + msg
		}
		return r
	case client.FailTimeout:
		if o.Events > 0 {
			return "timeout mid-stream"
		}
		return "timeout before the first token"
	case client.FailConnection:
		return "connection: " + connClass(o.Error)
	case client.FailStream:
		if api != "" || msg != "" {
			return strings.TrimSpace("stream error event "+api) + ": " + msg
		}
		return "stream broken: " + maskMessage(o.Error)
	case client.FailEmpty:
		return "no token in the response"
	case client.FailCanceled:
		return "canceled"
	case client.FailRequest:
		return "request not built: " + maskMessage(o.Error)
	}
	return "error: " + maskMessage(o.Error)
}

// failures counts outs' failures by reason.
func failures(outs []client.Outcome) []Failure {
	byReason := map[string]*Failure{}
	for i := range outs {
		o := &outs[i]
		if o.Success {
			continue
		}
		r := FailureReason(o)
		f, ok := byReason[r]
		if !ok {
			code := o.ErrorCode
			if code == "" {
				code = o.ErrorType
			}
			f = &Failure{Reason: r, Kind: o.FailKind, Status: o.Status, Code: code}
			if f.Kind == "" {
				f.Kind = "error"
			}
			byReason[r] = f
		}
		f.Count++
	}
	var out []Failure
	for _, f := range byReason {
		out = append(out, *f)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}

// Compute summarises outcomes of a run that took dur.
func Compute(outs []client.Outcome, dur time.Duration, o Options) Summary {
	ps := o.Percentiles
	if ps == nil {
		ps = DefaultPercentiles
	}
	s := Summary{Total: len(outs), Duration: dur, Percentiles: ps, SLO: o.SLO, Metrics: map[string]Stats{}}
	vals := map[string][]float64{}
	for i := range outs {
		out := &outs[i]
		if !out.Success {
			s.Failed++
			continue
		}
		s.Completed++
		s.TotalInput += out.PromptLen
		s.TotalOutput += out.OutputTokens
		vals["ttft"] = append(vals["ttft"], ms(out.TTFT))
		if out.HasAnswer {
			vals["ttfo"] = append(vals["ttfo"], ms(out.TTFO))
		}
		if out.Reasoning {
			s.Reasoning++
		}
		if tpot, ok := TPOT(out); ok {
			vals["tpot"] = append(vals["tpot"], ms(tpot))
		}
		for _, g := range out.ITL {
			vals["itl"] = append(vals["itl"], ms(g))
		}
		vals["e2el"] = append(vals["e2el"], ms(out.Latency))
		if o.SLO.Good(out) {
			s.Good++
		}
		for k, missed := range o.SLO.missed(out) {
			if missed {
				if s.Misses == nil {
					s.Misses = map[string]int{}
				}
				s.Misses[k]++
			}
		}
	}
	if sec := dur.Seconds(); sec > 0 {
		s.RequestThroughput = float64(s.Completed) / sec
		s.RequestGoodput = float64(s.Good) / sec
		s.OutputThroughput = float64(s.TotalOutput) / sec
		s.TotalTokenThroughput = float64(s.TotalInput+s.TotalOutput) / sec
	}
	if s.Total > 0 {
		s.Attainment = float64(s.Good) / float64(s.Total)
	}
	names := o.Metrics
	if names == nil {
		names = AllMetrics
	}
	for _, m := range AllMetrics {
		if !slices.Contains(names, m) || (m == "ttfo" && s.Reasoning == 0) {
			continue
		}
		s.MetricOrder = append(s.MetricOrder, m)
		s.Metrics[m] = Summarize(vals[m], ps)
	}
	s.MaxOutputTokensPerS, s.MaxConcurrentRequests = peaks(outs)
	s.Budget = aggregateBudget(outs, ps)
	s.Failures = failures(outs)
	return s
}

// peaks computes vLLM's max output tokens per second and max concurrent
// requests over one-second buckets from the earliest successful start.
func peaks(outs []client.Outcome) (float64, int) {
	var t0, tEnd time.Time
	first := true
	for i := range outs {
		o := &outs[i]
		if !o.Success {
			continue
		}
		end := o.Start.Add(o.Latency)
		if first || o.Start.Before(t0) {
			t0 = o.Start
		}
		if first || end.After(tEnd) {
			tEnd = end
		}
		first = false
	}
	if first {
		return 0, 0
	}
	n := int(math.Ceil(tEnd.Sub(t0).Seconds())) + 1
	tokens := make([]float64, n)
	conc := make([]int, n)
	for i := range outs {
		o := &outs[i]
		if !o.Success {
			continue
		}
		base := o.Start.Sub(t0)
		for _, tt := range o.TokenTimes() {
			if b := int((base + tt).Seconds()); b >= 0 && b < n {
				tokens[b]++
			}
		}
		for b := int(base.Seconds()); b <= int((base+o.Latency).Seconds()) && b < n; b++ {
			conc[b]++
		}
	}
	return slices.Max(tokens), slices.Max(conc)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
