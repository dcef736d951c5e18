package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/internal/ssetest"
	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/runner"
	"github.com/pdserve/pdserve/pkg/workload"
)

var ms = ssetest.Ms

// approx compares floats to 1e-6 ms: far finer than the 1 ms the figures
// are promised to.
var approx = cmpopts.EquateApprox(0, 1e-6)

func TestQuantileMatchesNumpy(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 10}
	// numpy.percentile([1,2,3,4,10], p) for these p.
	for _, tc := range []struct{ p, want float64 }{
		{50, 3}, {90, 7.6}, {95, 8.8}, {99, 9.76}, {100, 10}, {25, 2}, {99.9, 9.976},
	} {
		if got := metrics.Quantile(xs, tc.p); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := metrics.Quantile(nil, 50); got != 0 {
		t.Errorf("empty set: %v, want 0", got)
	}
	s := metrics.Summarize([]float64{2, 4, 4, 4, 5, 5, 7, 9}, []float64{50})
	if s.Mean != 5 || s.Std != 2 || s.Median != 4.5 {
		t.Errorf("mean %v std %v median %v, want 5, 2 (population), 4.5", s.Mean, s.Std, s.Median)
	}
}

func TestParseGoodput(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    metrics.SLO
		wantErr bool
	}{
		{in: []string{"ttft:300", "tpot:50"}, want: metrics.SLO{TTFT: ms(300), TPOT: ms(50)}},
		{in: []string{"ttft:300 tpot:50,e2el:2500.5"}, want: metrics.SLO{TTFT: ms(300), TPOT: ms(50), E2EL: ms(2500.5)}},
		{in: nil, want: metrics.SLO{}},
		{in: []string{"ttft"}, wantErr: true},
		{in: []string{"ttft:-1"}, wantErr: true},
		{in: []string{"itl:30"}, wantErr: true},
		{in: []string{"tpot:abc"}, wantErr: true},
	} {
		got, err := metrics.ParseGoodput(tc.in...)
		if tc.wantErr {
			if !errors.Is(err, metrics.ErrBadSpec) {
				t.Errorf("%q: got %v, want ErrBadSpec", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	if s := (metrics.SLO{TTFT: ms(300), E2EL: ms(1000)}).String(); s != "ttft:300 e2el:1000" {
		t.Errorf("String() = %q", s)
	}
}

// scriptedRun sends one request per script through the runner and client
// against the scripted server, one at a time, in virtual time.
func scriptedRun(t *testing.T, endpoint string, scripts []ssetest.Script) runner.Result {
	t.Helper()
	clock := ssetest.NewClock(time.Unix(1_700_000_000, 0))
	next := 0
	srv := ssetest.NewServer(t, clock, func(ssetest.Request) ssetest.Script {
		s := scripts[next] // requests arrive one at a time, in order
		next++
		return s
	})
	c, err := client.New(client.Options{BaseURL: srv.URL, Endpoint: endpoint, Model: "m", Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	w, err := workload.Random(workload.RandomOptions{InputLen: 32, OutputLen: 4}, len(scripts), 1, workload.Synth{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := runner.Run(context.Background(), w.Requests, c.Do, runner.Config{MaxConcurrency: 1, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func tokens(at ...float64) []ssetest.Token {
	var out []ssetest.Token
	for _, a := range at {
		out = append(out, ssetest.Token{At: ms(a), Text: "t"})
	}
	return out
}

// TestScriptedRun checks every metric and goodput end to end against a
// server with known token timings: five requests, one of them with a
// single token, two failed.
func TestScriptedRun(t *testing.T) {
	b0 := map[string]any{"queue_ms": 10.0, "prefill_ms": 80.0, "kv_transfer_ms": 5.0, "decode_ms": 60.0,
		"kv_bytes_raw": 1000.0, "kv_bytes_wire": 500.0, "codec": "zstd", "first_token_policy": "prefill", "batch_size": 2.0,
		"cost_usd": 0.002, "prompt_tokens": 10.0, "output_tokens": 4.0, "warnings": []any{"engine behind its model"}}
	b3 := map[string]any{"queue_ms": 30.0, "prefill_ms": 40.0, "kv_transfer_ms": 15.0, "decode_ms": 80.0,
		"kv_bytes_raw": 3000.0, "kv_bytes_wire": 1500.0, "codec": "zstd", "first_token_policy": "prefill", "batch_size": 4.0,
		"cost_usd": 0.001, "prompt_tokens": 20.0, "output_tokens": 3.0, "warnings": []any{}}
	scripts := []ssetest.Script{
		// 0: TTFT 100, ITL 20 20 20, E2EL 160, TPOT 20; stream ends at 170.
		{Events: ssetest.Stream(false, tokens(100, 120, 140, 160), ms(170), 4, b0)},
		// 1: one token: TTFT 300, E2EL 300, no TPOT; ends at 305.
		{Events: ssetest.Stream(false, tokens(300), ms(305), 1, nil)},
		// 2: rejected at once.
		{Status: 503, Body: "overloaded"},
		// 3: TTFT 50, ITL 40 40, E2EL 130, TPOT 40; ends at 130.
		{Events: ssetest.Stream(false, tokens(50, 90, 130), ms(130), 3, b3)},
		// 4: fails mid-stream at 60 ms after one token.
		{Events: []ssetest.Event{
			{At: ms(40), Data: `{"choices":[{"index":0,"text":"t"}]}`},
			{At: ms(60), Data: `{"error":{"message":"worker lost"}}`},
		}},
	}
	res := scriptedRun(t, "", scripts)
	// Virtual time: the requests run back to back.
	if want := ms(170 + 305 + 0 + 130 + 60); res.Duration != want {
		t.Fatalf("duration %v, want %v", res.Duration, want)
	}
	dur := res.Duration.Seconds()
	ps := []float64{50, 90, 99}
	for _, tc := range []struct {
		name   string
		slo    metrics.SLO
		good   int
		misses map[string]int
	}{
		{"ttft and tpot", metrics.SLO{TTFT: ms(120), TPOT: ms(30)}, 1, map[string]int{"ttft": 1, "tpot": 1}}, // 0 only: 1 misses TTFT, 3 misses TPOT
		{"ttft only", metrics.SLO{TTFT: ms(400)}, 3, nil},                                                    // every completed request
		{"tpot only", metrics.SLO{TPOT: ms(30)}, 2, map[string]int{"tpot": 1}},                               // 0, and 1 (one token: TPOT 0)
		{"e2el only", metrics.SLO{E2EL: ms(200)}, 2, map[string]int{"e2el": 1}},                              // 0 and 3
		{"at the boundary", metrics.SLO{TTFT: ms(100), TPOT: ms(40)}, 2, map[string]int{"ttft": 1}},          // ≤ counts: 0 and 3
		{"none", metrics.SLO{}, 3, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := metrics.Compute(res.Outcomes, res.Duration, metrics.Options{Percentiles: ps, SLO: tc.slo})
			want := metrics.Summary{
				Total: 5, Completed: 3, Failed: 2, Good: tc.good, Duration: res.Duration,
				TotalInput: 96, TotalOutput: 8,
				RequestThroughput: 3 / dur, RequestGoodput: float64(tc.good) / dur,
				OutputThroughput: 8 / dur, TotalTokenThroughput: 104 / dur,
				Attainment:          float64(tc.good) / 5,
				MaxOutputTokensPerS: 8, MaxConcurrentRequests: 3,
				Percentiles: ps, SLO: tc.slo,
				MetricOrder: []string{"ttft", "tpot", "itl", "e2el"},
				Metrics: map[string]metrics.Stats{
					// TTFT 100, 300, 50.
					"ttft": {N: 3, Mean: 150, Median: 100, Std: math.Sqrt(35000.0 / 3),
						Percentiles: []metrics.Percentile{{P: 50, Value: 100}, {P: 90, Value: 260}, {P: 99, Value: 296}}},
					// TPOT 20, 40 (the one-token request has none).
					"tpot": {N: 2, Mean: 30, Median: 30, Std: 10,
						Percentiles: []metrics.Percentile{{P: 50, Value: 30}, {P: 90, Value: 38}, {P: 99, Value: 39.8}}},
					// ITL 20 20 20 40 40.
					"itl": {N: 5, Mean: 28, Median: 20, Std: math.Sqrt((3*64 + 2*144) / 5.0),
						Percentiles: []metrics.Percentile{{P: 50, Value: 20}, {P: 90, Value: 40}, {P: 99, Value: 40}}},
					// E2EL 160, 300, 130.
					"e2el": {N: 3, Mean: 590.0 / 3, Median: 160,
						Std:         math.Sqrt((math.Pow(160-590.0/3, 2) + math.Pow(300-590.0/3, 2) + math.Pow(130-590.0/3, 2)) / 3),
						Percentiles: []metrics.Percentile{{P: 50, Value: 160}, {P: 90, Value: 272}, {P: 99, Value: 297.2}}},
				},
				Budget: &metrics.Budget{
					Requests:  2,
					TermOrder: []string{"queue_ms", "prefill_ms", "kv_transfer_ms", "decode_ms"},
					Terms: map[string]metrics.Stats{
						"queue_ms": {N: 2, Mean: 20, Median: 20, Std: 10,
							Percentiles: []metrics.Percentile{{P: 50, Value: 20}, {P: 90, Value: 28}, {P: 99, Value: 29.8}}},
						"prefill_ms": {N: 2, Mean: 60, Median: 60, Std: 20,
							Percentiles: []metrics.Percentile{{P: 50, Value: 60}, {P: 90, Value: 76}, {P: 99, Value: 79.6}}},
						"kv_transfer_ms": {N: 2, Mean: 10, Median: 10, Std: 5,
							Percentiles: []metrics.Percentile{{P: 50, Value: 10}, {P: 90, Value: 14}, {P: 99, Value: 14.9}}},
						"decode_ms": {N: 2, Mean: 70, Median: 70, Std: 10,
							Percentiles: []metrics.Percentile{{P: 50, Value: 70}, {P: 90, Value: 78}, {P: 99, Value: 79.8}}},
					},
					Sums:    map[string]float64{"kv_bytes_raw": 4000, "kv_bytes_wire": 2000, "cost_usd": 0.003},
					Means:   map[string]float64{"batch_size": 3, "prompt_tokens": 15, "output_tokens": 3.5},
					Labels:  map[string][]string{"codec": {"zstd"}, "first_token_policy": {"prefill"}},
					Warned:  1,
					Warning: "engine behind its model",
				},
				Failures: []metrics.Failure{
					{Reason: "HTTP 503: overloaded", Kind: client.FailHTTP, Status: 503, Count: 1},
					{Reason: "stream error event: worker lost", Kind: client.FailStream, Status: 200, Count: 1},
				},
				Misses: tc.misses,
			}
			if diff := cmp.Diff(want, s, approx); diff != "" {
				t.Errorf("summary (-want +got):\n%s", diff)
			}
			if r := s.Budget.CompressionRatio(); r != 2 {
				t.Errorf("compression ratio %v, want 2", r)
			}
			// $0.003 for 2 × (15 + 3.5) tokens.
			if c, ok := s.Budget.CostPer1kTokens(); !ok || math.Abs(c-0.003/37*1000) > 1e-12 {
				t.Errorf("cost per 1k tokens %v, %v; want %v", c, ok, 0.003/37*1000)
			}
		})
	}
}

// TestScriptedReasoning checks TTFO on a chat stream with reasoning tokens.
func TestScriptedReasoning(t *testing.T) {
	think := func(at ...float64) []ssetest.Token {
		var out []ssetest.Token
		for _, a := range at {
			out = append(out, ssetest.Token{At: ms(a), Text: "r", Reasoning: true})
		}
		return out
	}
	scripts := []ssetest.Script{
		// Reasoning at 40, 50; answer at 200, 210: TTFT 40, TTFO 200.
		{Events: ssetest.Stream(true, append(think(40, 50), ssetest.Token{At: ms(200), Text: "a"}, ssetest.Token{At: ms(210), Text: "b"}), ms(210), 4, nil)},
		// No reasoning: TTFO = TTFT = 70.
		{Events: ssetest.Stream(true, []ssetest.Token{{At: ms(70), Text: "a"}, {At: ms(80), Text: "b"}}, ms(80), 2, nil)},
		// Reasoning only, cut short: no answer, no TTFO.
		{Events: ssetest.Stream(true, think(30), ms(30), 1, nil)},
	}
	res := scriptedRun(t, "/v1/chat/completions", scripts)
	s := metrics.Compute(res.Outcomes, res.Duration, metrics.Options{Percentiles: []float64{50}, Metrics: []string{"ttft", "ttfo", "tpot"}})
	if s.Reasoning != 2 {
		t.Errorf("%d reasoning requests, want 2", s.Reasoning)
	}
	want := map[string]metrics.Stats{
		"ttft": {N: 3, Mean: 140.0 / 3, Median: 40, Std: math.Sqrt((math.Pow(40-140.0/3, 2) + math.Pow(70-140.0/3, 2) + math.Pow(30-140.0/3, 2)) / 3),
			Percentiles: []metrics.Percentile{{P: 50, Value: 40}}},
		"ttfo": {N: 2, Mean: 135, Median: 135, Std: 65, Percentiles: []metrics.Percentile{{P: 50, Value: 135}}},
		// TPOT (210−40)/3 and (80−70)/1.
		"tpot": {N: 2, Mean: (170.0/3 + 10) / 2, Median: (170.0/3 + 10) / 2, Std: (170.0/3 - 10) / 2,
			Percentiles: []metrics.Percentile{{P: 50, Value: (170.0/3 + 10) / 2}}},
	}
	if diff := cmp.Diff(want, s.Metrics, approx); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"ttft", "ttfo", "tpot"}, s.MetricOrder); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}

	// Without reasoning, TTFO is left out even when asked for.
	s = metrics.Compute(res.Outcomes[1:2], res.Duration, metrics.Options{Metrics: []string{"ttft", "ttfo"}})
	if diff := cmp.Diff([]string{"ttft"}, s.MetricOrder); diff != "" {
		t.Errorf("order without reasoning (-want +got):\n%s", diff)
	}
}

func TestEmptyRun(t *testing.T) {
	s := metrics.Compute([]client.Outcome{{Error: "refused"}}, time.Second, metrics.Options{SLO: metrics.SLO{TTFT: ms(1)}})
	if s.Completed != 0 || s.Failed != 1 || s.Attainment != 0 || s.Metrics["ttft"].Mean != 0 || s.Budget != nil {
		t.Errorf("got %+v", s)
	}
	if s.MaxConcurrentRequests != 0 || s.MaxOutputTokensPerS != 0 {
		t.Errorf("peaks %v %v for no success", s.MaxConcurrentRequests, s.MaxOutputTokensPerS)
	}
}

// TestBudgetResponseCache: lookups, hits and the TTFT of hits are
// counted from pdserve.cache.
func TestBudgetResponseCache(t *testing.T) {
	outs := []client.Outcome{
		{Success: true, TTFT: 41 * time.Millisecond, Budget: map[string]any{"cache": "miss", "ttft_ms": 40.0}},
		{Success: true, TTFT: 2 * time.Millisecond, Budget: map[string]any{"cache": "hit", "ttft_ms": 0.5}},
		{Success: true, TTFT: 4 * time.Millisecond, Budget: map[string]any{"cache": "hit", "ttft_ms": 1.5}},
		{Success: true, TTFT: 31 * time.Millisecond, Budget: map[string]any{"ttft_ms": 30.0}}, // not looked up
	}
	b := metrics.Compute(outs, time.Second, metrics.Options{Percentiles: []float64{50}}).Budget
	rate, ok := b.CacheHitRate()
	if !ok || b.CacheLookups != 3 || b.CacheHits != 2 || rate != 2.0/3 {
		t.Errorf("lookups %d hits %d rate %v %v", b.CacheLookups, b.CacheHits, rate, ok)
	}
	if b.HitTTFT == nil || b.HitTTFT.Mean != 1 || b.HitTTFT.N != 2 {
		t.Errorf("hit ttft %+v", b.HitTTFT)
	}
	if h, m := b.ClientHitTTFT, b.ClientMissTTFT; h == nil || m == nil || h.Mean != 3 || h.N != 2 || m.Mean != 41 || m.N != 1 {
		t.Errorf("client ttft of hits %+v, of misses %+v; want mean 3 ms of 2, 41 ms of 1 (the request not looked up is neither)", h, m)
	}
}

// TestBudgetMeansCountOmittedAsZero: a count the server omits when 0
// (decode_prefix_hit_tokens) averages over every request with a budget, so
// mean × requests is the run's total.
func TestBudgetMeansCountOmittedAsZero(t *testing.T) {
	outs := []client.Outcome{
		{Success: true, Budget: map[string]any{"prompt_tokens": 100.0, "decode_prefix_hit_tokens": 64.0}},
		{Success: true, Budget: map[string]any{"prompt_tokens": 300.0}},
		{Success: true, Budget: map[string]any{"prompt_tokens": 200.0, "decode_prefix_hit_tokens": 32.0}},
		{Success: false, Budget: map[string]any{"prompt_tokens": 900.0, "decode_prefix_hit_tokens": 900.0}}, // failed: not counted
	}
	b := metrics.Compute(outs, time.Second, metrics.Options{Percentiles: []float64{50}}).Budget
	if b.Requests != 3 || b.Means["prompt_tokens"] != 200 || b.Means["decode_prefix_hit_tokens"] != 32 {
		t.Errorf("requests %d, means %v; want 3, prompt_tokens 200, decode_prefix_hit_tokens 32 (96 / 3)", b.Requests, b.Means)
	}
}

// TestFailures: failed requests are counted by reason, with the HTTP
// status and the OpenAI error's type/code and message class (numbers
// masked), most frequent first; completed ones by the SLO they missed.
func TestFailures(t *testing.T) {
	kv := func(n int) client.Outcome {
		return client.Outcome{FailKind: client.FailHTTP, Status: 429, ErrorType: "rate_limit_error", ErrorCode: "overloaded",
			ErrorMessage: fmt.Sprintf("No decode worker has free KV cache for %d tokens now; retry later.", n)}
	}
	outs := []client.Outcome{
		kv(1200), kv(933), kv(77),
		{FailKind: client.FailHTTP, Status: 500, Error: "HTTP 500: internal error 42"},
		{FailKind: client.FailTimeout, Events: 3},
		{FailKind: client.FailConnection, Error: `client: send: Post "http://127.0.0.1:9/v1/completions": dial tcp 127.0.0.1:9: connect: connection refused`},
		{Success: true, OutputTokens: 3, TTFT: 300 * time.Millisecond, Latency: 400 * time.Millisecond},
		{Success: true, OutputTokens: 3, TTFT: 100 * time.Millisecond, Latency: 500 * time.Millisecond},
	}
	s := metrics.Compute(outs, time.Second, metrics.Options{SLO: metrics.SLO{TTFT: 200 * time.Millisecond, TPOT: 100 * time.Millisecond}})
	want := []metrics.Failure{
		{Reason: "HTTP 429 rate_limit_error/overloaded: No decode worker has free KV cache for N tokens now; retry later.",
			Kind: client.FailHTTP, Status: 429, Code: "overloaded", Count: 3},
		{Reason: "HTTP 500: internal error N", Kind: client.FailHTTP, Status: 500, Count: 1},
		{Reason: "connection: connection refused", Kind: client.FailConnection, Count: 1},
		{Reason: "timeout mid-stream", Kind: client.FailTimeout, Count: 1},
	}
	if diff := cmp.Diff(want, s.Failures); diff != "" {
		t.Errorf("failures (-want +got):\n%s", diff)
	}
	if s.Failed != 6 || s.FailureCount(429) != 3 || s.FailureCount(0) != 2 {
		t.Errorf("failed %d, 429s %d, no response %d; want 6, 3, 2", s.Failed, s.FailureCount(429), s.FailureCount(0))
	}
	if got := s.TopFailure(); got != "HTTP 429 overloaded and others" {
		t.Errorf("top failure %q", got)
	}
	if diff := cmp.Diff(map[string]int{"ttft": 1, "tpot": 1}, s.Misses); diff != "" {
		t.Errorf("misses (-want +got):\n%s", diff)
	}
	if s := metrics.Compute(outs[6:], time.Second, metrics.Options{}); s.Failures != nil || s.TopFailure() != "" {
		t.Errorf("no failure: %v %q", s.Failures, s.TopFailure())
	}
}
