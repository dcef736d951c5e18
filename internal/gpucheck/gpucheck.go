package gpucheck

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configure Run.
type Options struct {
	// Coordinator is the coordinator binary.
	Coordinator string
	// Model is the GGUF model file; LlamaLib the directory of llama.cpp's
	// shared libraries (--llama-lib).
	Model, LlamaLib string
	// Out is the directory the report (gpucheck.json), the profile
	// (profile.json) and the server logs go to.
	Out string
	// Deadline is when Run must have returned.
	Deadline time.Time
	// Modes to serve, in order: "disaggregated", "colocated".
	Modes []string
	// PromptTokens are the prompt lengths whose TTFT is measured.
	PromptTokens []int
	// Batches are the decode batch sizes measured.
	Batches []int
	// TTFTOutputTokens is max_tokens of a TTFT request (its greedy text is
	// compared across modes); DecodeTokens of a decode request;
	// DecodePromptTokens is a decode request's prompt length.
	TTFTOutputTokens, DecodeTokens, DecodePromptTokens int
	// CtxSize and MaxSeqs are the engine's --ctx-size and --max-seqs.
	CtxSize, MaxSeqs int
	// ProfileBudget is the profile's --budget, cut to the time left; 0
	// skips the profile.
	ProfileBudget time.Duration
	// EngineArgs are extra engine flags for every coordinator run
	// (--no-repack, --engine-threads N, --gpu-layers N, …).
	EngineArgs []string
	// LoadTimeout bounds the wait for a server to get ready.
	LoadTimeout time.Duration
	// Meta is copied into the report (build time, device, …).
	Meta map[string]string
}

// Report is the JSON the check writes. Times are milliseconds, rates
// tokens per second, sizes bytes.
type Report struct {
	Started  time.Time         `json:"started"`
	Model    string            `json:"model"`
	Meta     map[string]string `json:"meta,omitempty"`
	Settings Settings          `json:"settings"`
	Modes    []ModeReport      `json:"modes"`
	// GreedyMatch is true when every TTFT request's greedy text was the
	// same in every mode that ran it; nil when fewer than two modes ran.
	GreedyMatch *bool `json:"greedy_match"`
	// GreedyCompared counts the prompts compared.
	GreedyCompared int           `json:"greedy_compared"`
	Profile        ProfileReport `json:"profile"`
	// Skipped names every step left out and why.
	Skipped []string `json:"skipped,omitempty"`
	WallMs  float64  `json:"wall_ms"`
}

// Settings repeats the options that shape the figures.
type Settings struct {
	PromptTokens       []int    `json:"prompt_tokens"`
	Batches            []int    `json:"batches"`
	TTFTOutputTokens   int      `json:"ttft_output_tokens"`
	DecodeTokens       int      `json:"decode_tokens"`
	DecodePromptTokens int      `json:"decode_prompt_tokens"`
	CtxSize            int      `json:"ctx_size"`
	MaxSeqs            int      `json:"max_seqs"`
	EngineArgs         []string `json:"engine_args,omitempty"`
}

// ModeReport holds one mode's figures.
type ModeReport struct {
	Mode        string        `json:"mode"`
	LoadMs      float64       `json:"load_ms"`
	TTFT        []TTFTPoint   `json:"ttft"`
	Decode      []DecodePoint `json:"decode"`
	Errors      []string      `json:"errors,omitempty"`
	ServerLog   string        `json:"server_log"`
	ExitedEarly bool          `json:"exited_early,omitempty"`
}

// TTFTPoint is one greedy request of PromptTokens tokens.
type TTFTPoint struct {
	PromptTokens int `json:"prompt_tokens"`
	// ClientTTFTMs is the time from sending the request to the first
	// text chunk, on the client.
	ClientTTFTMs float64 `json:"client_ttft_ms"`
	// Budget is the request's pdserve object (ttft_ms, prefill_ms,
	// kv_transfer_ms, kv_bytes_raw, kv_bytes_wire, codec, …).
	Budget budgetFigures `json:"budget"`
	Text   string        `json:"text"`
}

// DecodePoint is Batch concurrent requests.
type DecodePoint struct {
	Batch int `json:"batch"`
	// AggregateTokS is Σ over requests of 1000/tpot_ms: the decode
	// tokens/s of the batch while every request decodes.
	AggregateTokS float64 `json:"aggregate_tok_s"`
	// PerSeqTokS is the mean of 1000/tpot_ms over the requests.
	PerSeqTokS float64 `json:"per_seq_tok_s"`
	// WallTokS is every output token over the wall time from the first
	// request sent to the last one done (prefills included).
	WallTokS float64 `json:"wall_tok_s"`
	// MeanBatchSize is the mean of the budgets' batch_size.
	MeanBatchSize float64 `json:"mean_batch_size"`
	OutputTokens  int     `json:"output_tokens"`
	WallMs        float64 `json:"wall_ms"`
	TTFTMeanMs    float64 `json:"ttft_mean_ms"`
	// KVTransferMeanMs and KVBytesWireMean are per request.
	KVTransferMeanMs float64 `json:"kv_transfer_mean_ms"`
	KVBytesWireMean  float64 `json:"kv_bytes_wire_mean"`
}

// budgetFigures is the part of the pdserve object the report keeps.
type budgetFigures struct {
	TTFTMs       float64 `json:"ttft_ms"`
	TPOTMs       float64 `json:"tpot_ms"`
	QueueMs      float64 `json:"queue_ms"`
	PrefillMs    float64 `json:"prefill_ms"`
	KVTransferMs float64 `json:"kv_transfer_ms"`
	KVStreamMs   float64 `json:"kv_stream_ms"`
	DecodeMs     float64 `json:"decode_ms"`
	E2EMs        float64 `json:"e2e_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	BatchSize    int     `json:"batch_size"`
	KVBytesRaw   int64   `json:"kv_bytes_raw"`
	KVBytesWire  int64   `json:"kv_bytes_wire"`
	Codec        string  `json:"codec"`
	Mode         string  `json:"mode"`
	FirstToken   string  `json:"first_token_policy"`
}

// ProfileReport says what the profile step did.
type ProfileReport struct {
	Path     string  `json:"path,omitempty"`
	BudgetMs float64 `json:"budget_ms,omitempty"`
	WallMs   float64 `json:"wall_ms,omitempty"`
	Error    string  `json:"error,omitempty"`
	Log      string  `json:"log,omitempty"`
}

// Modes Run knows.
const (
	Disaggregated = "disaggregated"
	Colocated     = "colocated"
)

// Time kept back at the end for writing the report and stopping servers.
const reserve = 15 * time.Second

// Validate checks the options.
func (o *Options) Validate() error {
	var errs []error
	if o.Coordinator == "" || o.Model == "" || o.LlamaLib == "" || o.Out == "" {
		errs = append(errs, errors.New("gpucheck: coordinator, model, llama-lib and out are required"))
	}
	if o.Deadline.IsZero() {
		errs = append(errs, errors.New("gpucheck: a deadline is required"))
	}
	for _, m := range o.Modes {
		if m != Disaggregated && m != Colocated {
			errs = append(errs, fmt.Errorf("gpucheck: mode %q: want %s or %s", m, Disaggregated, Colocated))
		}
	}
	for _, n := range append(append([]int{}, o.PromptTokens...), o.Batches...) {
		if n <= 0 {
			errs = append(errs, fmt.Errorf("gpucheck: prompt lengths and batches must be positive, got %d", n))
		}
	}
	if o.TTFTOutputTokens < 2 || o.DecodeTokens < 2 || o.DecodePromptTokens < 1 {
		errs = append(errs, errors.New("gpucheck: ttft and decode output tokens must be at least 2, decode prompt tokens at least 1"))
	}
	if o.CtxSize <= 0 || o.MaxSeqs <= 0 {
		errs = append(errs, errors.New("gpucheck: ctx-size and max-seqs must be positive"))
	}
	for _, b := range o.Batches {
		if b > o.MaxSeqs {
			errs = append(errs, fmt.Errorf("gpucheck: batch %d exceeds max-seqs %d", b, o.MaxSeqs))
		}
	}
	return errors.Join(errs...)
}

// Run serves and measures each mode, runs the profile and writes
// Out/gpucheck.json. It returns the report; an error means the report
// could not be written or nothing could be measured at all (every mode
// failed to start).
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("gpucheck: %w", err)
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(ctx, o.Deadline)
	defer cancel()
	r := &Report{Started: start.UTC(), Model: o.Model, Meta: o.Meta, Settings: Settings{
		PromptTokens: o.PromptTokens, Batches: o.Batches, TTFTOutputTokens: o.TTFTOutputTokens,
		DecodeTokens: o.DecodeTokens, DecodePromptTokens: o.DecodePromptTokens, CtxSize: o.CtxSize,
		MaxSeqs: o.MaxSeqs, EngineArgs: o.EngineArgs}}
	started := 0
	for i, m := range o.Modes {
		// Leave the later modes and the profile a share of the time.
		left := time.Until(o.Deadline) - reserve
		shares := len(o.Modes) - i
		if o.ProfileBudget > 0 {
			left -= min(o.ProfileBudget, left/time.Duration(shares+1))
		}
		modeDeadline := time.Now().Add(left / time.Duration(shares))
		mr, err := runMode(ctx, o, m, modeDeadline, &r.Skipped)
		if err != nil {
			r.Skipped = append(r.Skipped, fmt.Sprintf("%s: %v", m, err))
		} else {
			started++
		}
		if mr != nil {
			r.Modes = append(r.Modes, *mr)
		}
	}
	r.GreedyMatch, r.GreedyCompared = compareGreedy(r.Modes)
	r.Profile = runProfile(ctx, o, &r.Skipped)
	r.WallMs = msSince(start)
	if err := writeJSON(filepath.Join(o.Out, "gpucheck.json"), r); err != nil {
		return r, err
	}
	if started == 0 && len(o.Modes) > 0 {
		return r, errors.New("gpucheck: no mode could be served")
	}
	return r, nil
}

// compareGreedy compares the TTFT texts of every mode, by prompt length.
func compareGreedy(modes []ModeReport) (*bool, int) {
	texts := map[int][]string{}
	for _, m := range modes {
		for _, p := range m.TTFT {
			texts[p.PromptTokens] = append(texts[p.PromptTokens], p.Text)
		}
	}
	match, n := true, 0
	for _, ts := range texts {
		if len(ts) < 2 {
			continue
		}
		n++
		for _, t := range ts[1:] {
			if t != ts[0] {
				match = false
			}
		}
	}
	if n == 0 {
		return nil, 0
	}
	return &match, n
}

// server is one running coordinator.
type server struct {
	cmd   *exec.Cmd
	url   string
	model string // the first id of GET /v1/models
	done  chan struct{}
	err   error
	log   *os.File
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startServer(o Options, mode string) (*server, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", fmt.Errorf("free port: %w", err)
	}
	logPath := filepath.Join(o.Out, "coordinator-"+mode+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	args := []string{"--standalone", "--mode", mode, "--decode-workers", "1",
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--nats-listen", "127.0.0.1:-1",
		"--engine", "llamacpp", "--model", o.Model, "--llama-lib", o.LlamaLib,
		"--ctx-size", strconv.Itoa(o.CtxSize), "--max-seqs", strconv.Itoa(o.MaxSeqs)}
	if mode == Disaggregated {
		args = append(args, "--prefill-workers", "1")
	}
	args = append(args, o.EngineArgs...)
	cmd := exec.Command(o.Coordinator, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, logPath, fmt.Errorf("start %s: %w", o.Coordinator, err)
	}
	s := &server{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d", port), done: make(chan struct{}), log: f}
	go func() { s.err = cmd.Wait(); close(s.done) }()
	return s, logPath, nil
}

// stop ends the server with SIGTERM, then SIGKILL after 20 s.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.log.Close()
}

// waitReady polls /readyz until it answers 200, the server exits or ctx
// ends.
func (s *server) waitReady(ctx context.Context) error {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s.readModel(ctx)
			}
		}
		select {
		case <-s.done:
			return fmt.Errorf("server exited before ready: %v", s.err)
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// readModel sets s.model to the first model the server lists.
func (s *server) readModel(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/v1/models", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET /v1/models: %w", err)
	}
	defer resp.Body.Close()
	var l struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || len(l.Data) == 0 {
		return fmt.Errorf("GET /v1/models: HTTP %d, no model listed (%v)", resp.StatusCode, err)
	}
	s.model = l.Data[0].ID
	return nil
}

func runMode(ctx context.Context, o Options, mode string, deadline time.Time, skipped *[]string) (*ModeReport, error) {
	if time.Until(deadline) < 20*time.Second {
		return nil, fmt.Errorf("skipped: %v left for the mode", time.Until(deadline).Round(time.Second))
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	s, logPath, err := startServer(o, mode)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	mr := &ModeReport{Mode: mode, ServerLog: filepath.Base(logPath)}
	t0 := time.Now()
	lctx, lcancel := context.WithTimeout(ctx, o.LoadTimeout)
	err = s.waitReady(lctx)
	lcancel()
	if err != nil {
		return mr, fmt.Errorf("load: %w (see %s)", err, filepath.Base(logPath))
	}
	mr.LoadMs = msSince(t0)
	// A warm-up request: the first llama_decode of a process allocates.
	if _, err := complete(ctx, s, prompt(16, 1), 2); err != nil {
		return mr, fmt.Errorf("warm-up: %w", err)
	}
	// Decode first (short prompts), then TTFT from the shortest prompt
	// up; each step is skipped once the mode's time runs out.
	var last time.Duration
	for _, b := range o.Batches {
		if left := time.Until(deadline); last*2 > left {
			*skipped = append(*skipped, fmt.Sprintf("%s: decode at batch %d: %v left, the last step took %v", mode, b, left.Round(time.Second), last.Round(time.Second)))
			continue
		}
		t := time.Now()
		p, err := decodePoint(ctx, s, o, b)
		last = time.Since(t)
		if err != nil {
			mr.Errors = append(mr.Errors, fmt.Sprintf("decode at batch %d: %v", b, err))
			continue
		}
		mr.Decode = append(mr.Decode, p)
	}
	last = 0
	for _, n := range o.PromptTokens {
		if n+o.TTFTOutputTokens > o.CtxSize {
			*skipped = append(*skipped, fmt.Sprintf("%s: TTFT at %d tokens: longer than --ctx-size %d", mode, n, o.CtxSize))
			continue
		}
		// A prompt k times longer takes at least k times the last one.
		if left := time.Until(deadline); last > 0 && last*4 > left {
			*skipped = append(*skipped, fmt.Sprintf("%s: TTFT at %d tokens: %v left, the last took %v", mode, n, left.Round(time.Second), last.Round(time.Second)))
			continue
		}
		t := time.Now()
		res, err := complete(ctx, s, prompt(n, uint64(n)), o.TTFTOutputTokens)
		last = time.Since(t)
		if err != nil {
			mr.Errors = append(mr.Errors, fmt.Sprintf("TTFT at %d tokens: %v", n, err))
			continue
		}
		mr.TTFT = append(mr.TTFT, TTFTPoint{PromptTokens: n, ClientTTFTMs: res.ttftMs, Budget: res.budget, Text: res.text})
	}
	select {
	case <-s.done:
		mr.ExitedEarly = true
	default:
	}
	return mr, nil
}

// decodePoint sends b concurrent requests and sums their decode rates.
func decodePoint(ctx context.Context, s *server, o Options, b int) (DecodePoint, error) {
	res := make([]result, b)
	errs := make([]error, b)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range b {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = complete(ctx, s, prompt(o.DecodePromptTokens, uint64(1000*b+i)), o.DecodeTokens)
		}()
	}
	wg.Wait()
	p := DecodePoint{Batch: b, WallMs: msSince(t0)}
	if err := errors.Join(errs...); err != nil {
		return p, err
	}
	var batch, ttft, kvMs, kvBytes float64
	for _, r := range res {
		if r.budget.TPOTMs <= 0 {
			return p, fmt.Errorf("a request's budget has tpot_ms %v", r.budget.TPOTMs)
		}
		rate := 1000 / r.budget.TPOTMs
		p.AggregateTokS += rate
		p.OutputTokens += r.budget.OutputTokens
		batch += float64(r.budget.BatchSize)
		ttft += r.budget.TTFTMs
		kvMs += r.budget.KVTransferMs
		kvBytes += float64(r.budget.KVBytesWire)
	}
	n := float64(b)
	p.PerSeqTokS = p.AggregateTokS / n
	p.MeanBatchSize = batch / n
	p.TTFTMeanMs = ttft / n
	p.KVTransferMeanMs = kvMs / n
	p.KVBytesWireMean = kvBytes / n
	p.WallTokS = float64(p.OutputTokens) / (p.WallMs / 1000)
	return p, nil
}

// prompt returns n token ids drawn from seed, in [1000, 30000): ids every
// vocabulary of the bundled models has, and no two prompts of different
// seeds share a prefix (so no prefix cache serves one from another).
func prompt(n int, seed uint64) []int {
	ids := make([]int, n)
	z := seed*0x9e3779b97f4a7c15 + 1
	for i := range ids {
		z += 0x9e3779b97f4a7c15
		x := z
		x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
		x = (x ^ (x >> 27)) * 0x94d049bb133111eb
		x ^= x >> 31
		ids[i] = 1000 + int(x%29000)
	}
	return ids
}

type result struct {
	ttftMs float64
	text   string
	budget budgetFigures
}

// complete sends one streamed greedy completion of the token prompt and
// reads it to the end.
func complete(ctx context.Context, s *server, ids []int, maxTokens int) (result, error) {
	body, _ := json.Marshal(map[string]any{
		"model": s.model, "prompt": ids, "max_tokens": maxTokens, "temperature": 0,
		"ignore_eos": true, "stream": true,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return result{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	var r result
	var text strings.Builder
	gotBudget := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			break
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			PDServe *budgetFigures `json:"pdserve"`
			Error   *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return r, fmt.Errorf("stream chunk %q: %w", data, err)
		}
		if c.Error != nil {
			return r, fmt.Errorf("stream error: %s", c.Error.Message)
		}
		for _, ch := range c.Choices {
			if ch.Text != "" && r.ttftMs == 0 {
				r.ttftMs = msSince(t0)
			}
			text.WriteString(ch.Text)
		}
		if c.PDServe != nil {
			r.budget, gotBudget = *c.PDServe, true
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	if !gotBudget {
		return r, errors.New("the stream ended without a pdserve budget")
	}
	r.text = text.String()
	return r, nil
}

func runProfile(ctx context.Context, o Options, skipped *[]string) ProfileReport {
	if o.ProfileBudget <= 0 {
		*skipped = append(*skipped, "profile: --profile-budget 0")
		return ProfileReport{}
	}
	// The profiler fits its grid to --budget; give it what is left less
	// the model load and the reserve, and kill it at the deadline.
	left := time.Until(o.Deadline) - reserve
	budget := min(o.ProfileBudget, left-30*time.Second)
	if budget < 10*time.Second {
		*skipped = append(*skipped, fmt.Sprintf("profile: %v left", left.Round(time.Second)))
		return ProfileReport{}
	}
	p := ProfileReport{Path: "profile.json", BudgetMs: float64(budget.Milliseconds()), Log: "profile.log"}
	f, err := os.Create(filepath.Join(o.Out, p.Log))
	if err != nil {
		p.Error = err.Error()
		return p
	}
	defer f.Close()
	pctx, cancel := context.WithDeadline(ctx, o.Deadline.Add(-reserve/2))
	defer cancel()
	args := []string{"profile", "--engine", "llamacpp", "--model", o.Model, "--llama-lib", o.LlamaLib,
		"--ctx-size", strconv.Itoa(o.CtxSize), "--max-seqs", strconv.Itoa(o.MaxSeqs),
		"--budget", budget.String(), "--out", filepath.Join(o.Out, p.Path)}
	args = append(args, o.EngineArgs...)
	cmd := exec.CommandContext(pctx, o.Coordinator, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.WaitDelay = 5 * time.Second
	t := time.Now()
	err = cmd.Run()
	p.WallMs = msSince(t)
	if err != nil {
		p.Error = fmt.Sprintf("coordinator profile: %v (see %s)", err, p.Log)
		p.Path = ""
	}
	return p
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("gpucheck: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("gpucheck: %w", err)
	}
	return nil
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// ParseInts parses a comma-separated list of positive integers, sorted.
func ParseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	sort.Ints(out)
	return out, nil
}
