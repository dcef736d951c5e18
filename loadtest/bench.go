package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/pdserve/pdserve/loadtest/arrival"
	"github.com/pdserve/pdserve/loadtest/client"
	"github.com/pdserve/pdserve/loadtest/metrics"
	"github.com/pdserve/pdserve/loadtest/report"
	"github.com/pdserve/pdserve/loadtest/runner"
	"github.com/pdserve/pdserve/pkg/workload"
)

// bench runs one workload against one endpoint, possibly many times (at
// different rates).
type bench struct {
	o      *benchOptions
	wl     *workload.Workload
	cl     *client.Client
	stderr io.Writer
	// now is the date stamp of results (time.Now in production).
	now func() time.Time
	// warned records that the short-run warning was printed.
	warned bool
	// probes counts the runs so far: the next run's probe index.
	probes int
}

// probeSeed is the seed of probe k's prompt content: seed itself for the
// first probe (so a single run sends what --seed always sent), else a
// SplitMix64 mix of seed and k, so that every probe of a sweep or
// comparison sends prompts of its own (the same lengths and arrivals) and
// none hits KV an earlier probe left, beyond a requested shared prefix.
func probeSeed(seed uint64, k int) uint64 {
	if k == 0 {
		return seed
	}
	z := seed + uint64(k)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// nextProbe returns the workload of the next run and its probe index and
// content seed: the loaded workload with its content drawn from
// probeSeed, or as loaded with --same-prompts.
func (b *bench) nextProbe() (*workload.Workload, int, uint64) {
	k := b.probes
	b.probes++
	if b.o.SamePrompts {
		return b.wl, k, b.o.Seed
	}
	seed := probeSeed(b.o.Seed, k)
	if seed == b.o.Seed {
		return b.wl, k, seed
	}
	return b.wl.WithContentSeed(seed), k, seed
}

// minSpan is the offered-load span below which a run is flagged as too
// short to reach a steady state.
const minSpan = 20 * time.Second

// newBench loads the workload and prepares the client. baseURL overrides
// o.BaseURL when not empty (a local deployment).
func newBench(ctx context.Context, o *benchOptions, baseURL string, stderr io.Writer) (*bench, error) {
	wl, err := o.loadedWorkload()
	if err != nil {
		return nil, err
	}
	repeatRequests(wl.Requests, o.RepeatFraction, o.Seed)
	if baseURL == "" {
		baseURL = o.BaseURL
	}
	b := &bench{o: o, wl: wl, stderr: stderr, now: time.Now}
	if err := b.connect(ctx, baseURL); err != nil {
		return nil, err
	}
	return b, nil
}

// connect points the bench at baseURL: waits for it when asked, finds the
// model name when not given, and builds the client.
func (b *bench) connect(ctx context.Context, baseURL string) error {
	o := b.o
	if o.ReadyTimeout > 0 {
		if err := waitReady(ctx, baseURL+"/v1/models", time.Duration(o.ReadyTimeout*float64(time.Second))); err != nil {
			return err
		}
	}
	model := o.Model
	if model == "" {
		var err error
		if model, err = discoverModel(ctx, baseURL, o.APIKey); err != nil {
			return fmt.Errorf("no --model given and %w", err)
		}
	}
	cl, err := client.New(client.Options{
		BaseURL: baseURL, Endpoint: o.Endpoint, Model: model, APIKey: o.APIKey,
		IgnoreEOS: o.IgnoreEOS, NoStream: o.NoStream, Temperature: o.Temperature, ExtraBody: o.extra,
	})
	if err != nil {
		return err
	}
	b.cl = cl
	return nil
}

// model returns the model name requests carry.
func (b *bench) model() string {
	if b.o.Model != "" {
		return b.o.Model
	}
	return b.cl.Model()
}

// schedule returns the send offsets (wall time) of a run at rate (req/s;
// +Inf: all at once; for trace replay, the mean rate to scale the trace
// to, or 0 to keep --trace-time-scale) and its description.
func (b *bench) schedule(rate float64) ([]time.Duration, string, float64, error) {
	o := b.o
	n := len(b.wl.Requests)
	var (
		sched []time.Duration
		desc  string
		err   error
	)
	if o.TraceReplay {
		offs := make([]time.Duration, n)
		for i, r := range b.wl.Requests {
			offs[i] = r.Arrival
		}
		scale := o.TraceTimeScale
		if rate > 0 && !math.IsInf(rate, 1) {
			if scale, err = arrival.ScaleForRate(offs, rate); err != nil {
				return nil, "", 0, err
			}
		}
		if sched, err = arrival.Trace(offs, scale); err != nil {
			return nil, "", 0, err
		}
		rate = arrival.MeanRate(sched)
		desc = fmt.Sprintf("%s trace timestamps ×%.4g (mean %.3g req/s)", o.DatasetName, scale, rate)
	} else {
		if sched, err = arrival.Gamma(n, rate, o.Burstiness, o.Seed); err != nil {
			return nil, "", 0, err
		}
		switch {
		case math.IsInf(rate, 1):
			desc = "all at once"
		case o.Burstiness == 1:
			desc = fmt.Sprintf("Poisson %.4g req/s", rate)
		default:
			desc = fmt.Sprintf("gamma %.4g req/s, burstiness %g (interval CV %.2f)", rate, o.Burstiness, 1/math.Sqrt(o.Burstiness))
		}
	}
	if o.MaxConcurrency > 0 {
		desc += fmt.Sprintf(", max concurrency %d", o.MaxConcurrency)
	}
	if o.TimeScale != 1 {
		for i := range sched {
			sched[i] = time.Duration(float64(sched[i]) * o.TimeScale)
		}
	}
	return sched, desc, rate, nil
}

// arrivalKind describes the arrival process of a sweep, whose rate varies.
func arrivalKind(o *benchOptions) string {
	var d string
	switch {
	case o.TraceReplay:
		d = fmt.Sprintf("%s trace timestamps, scaled to each rate", o.DatasetName)
	case o.Burstiness == 1:
		d = "Poisson"
	default:
		d = fmt.Sprintf("gamma, burstiness %g (interval CV %.2f)", o.Burstiness, 1/math.Sqrt(o.Burstiness))
	}
	if o.MaxConcurrency > 0 {
		d += fmt.Sprintf(", max concurrency %d", o.MaxConcurrency)
	}
	return d
}

// runOut is one run's outcome.
type runOut struct {
	res  runner.Result
	sum  metrics.Summary
	meta report.Meta
}

// run sends the workload at rate and summarises it. title labels the
// progress bar.
func (b *bench) run(ctx context.Context, rate float64, title string) (runOut, error) {
	o := b.o
	sched, desc, rate, err := b.schedule(rate)
	if err != nil {
		return runOut{}, err
	}
	if n := len(sched); n > 1 && !b.warned && !math.IsInf(rate, 1) {
		if span := time.Duration(float64(sched[n-1]) / o.TimeScale); span < minSpan {
			b.warned = true
			fmt.Fprintf(b.stderr, "note: at %.3g req/s the %d requests span only %.1f s; figures reflect the start-up more than a steady state (raise --num-prompts)\n",
				rate, n, span.Seconds())
		}
	}
	wl, probe, contentSeed := b.nextProbe()
	bar := newProgress(b.stderr, o.Quiet, title)
	res, err := runner.Run(ctx, wl.Requests, b.cl.Do, runner.Config{
		Schedule: sched, MaxConcurrency: o.MaxConcurrency, RequestTimeout: o.RequestTimeout, Progress: bar.update,
	})
	bar.finish()
	if err != nil {
		return runOut{}, err
	}
	runner.Scale(&res, o.TimeScale)
	sum := metrics.Compute(res.Outcomes, res.Duration, metrics.Options{Metrics: o.metricNames, Percentiles: o.percentiles, SLO: o.slo})
	backend := "openai"
	if b.cl.Chat() {
		backend = "openai-chat"
	}
	meta := report.Meta{
		Date: b.now().Format("20060102-150405"), Backend: backend, Label: o.Label,
		BaseURL: b.cl.BaseURL(), Endpoint: o.Endpoint, Model: b.model(),
		Tokenizer: o.Tokenizer, Format: o.PromptFormat, NumPrompts: len(b.wl.Requests),
		RequestRate: rate, Burstiness: o.Burstiness, MaxConcurrency: o.MaxConcurrency,
		Arrival: desc, DatasetName: o.DatasetName, DatasetPath: o.DatasetPath,
		Workload: b.wl.Description, Notes: b.wl.Notes, Seed: o.Seed, IgnoreEOS: o.IgnoreEOS,
		Probe: probe, ContentSeed: contentSeed, SamePrompts: o.SamePrompts, SharedPrefix: b.wl.SharedPrefixLen(),
		TimeScale: o.TimeScale, Interrupted: res.Interrupted, Metadata: o.meta,
	}
	if res.Interrupted {
		err = context.Cause(ctx)
		if err == nil {
			err = errors.New("interrupted")
		}
	}
	return runOut{res: res, sum: sum, meta: meta}, err
}

// discoverModel returns the first model id of GET /v1/models.
func discoverModel(ctx context.Context, baseURL, apiKey string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET /v1/models failed: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /v1/models answered %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil || len(body.Data) == 0 || body.Data[0].ID == "" {
		return "", fmt.Errorf("GET /v1/models listed no model")
	}
	return body.Data[0].ID, nil
}

// waitReady polls url until it answers 200 or timeout passes.
func waitReady(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("%s answered %s", url, resp.Status)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %v: %v", url, timeout, last)
		case <-tick.C:
		}
	}
}

// outPath is where an output file named name goes: name itself when it
// is absolute (as vLLM's --result-filename), else name under dir.
func outPath(dir, name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(dir, name)
}

// saveJSON writes v to outPath(dir, name), creating its directory; it
// returns the path.
func saveJSON(dir, name string, v any) (string, error) {
	p := outPath(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	if err := report.WriteJSON(f, v); err != nil {
		f.Close()
		return "", err
	}
	return p, f.Close()
}
