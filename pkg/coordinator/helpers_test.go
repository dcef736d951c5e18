package coordinator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/kv"
	"github.com/pdserve/pdserve/pkg/plannerhost"
	"github.com/pdserve/pdserve/pkg/standalone"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// waitFor polls f every few milliseconds until it returns nil, failing the
// test with f's last error after timeout.
func waitFor(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	poll.CheckFor(t, timeout, 5*time.Millisecond, f)
}

// gatedEngine wraps a decode worker's engine so the test controls its
// progress: every Decode call takes one token from gate first (a closed
// gate lets every step through). A new gate lets no step through.
type gatedEngine struct {
	engine.Engine
	gate  chan struct{}
	once  sync.Once
	steps atomic.Int64
}

func newGated(e engine.Engine) *gatedEngine {
	return &gatedEngine{Engine: e, gate: make(chan struct{}, 1024)}
}

func (g *gatedEngine) Decode(ctx context.Context, batch []engine.DecodeItem) ([]engine.Output, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	g.steps.Add(1)
	return g.Engine.Decode(ctx, batch)
}

// allow lets n more decode steps run.
func (g *gatedEngine) allow(n int) {
	for range n {
		g.gate <- struct{}{}
	}
}

// open lets every step run from now on.
func (g *gatedEngine) open() { g.once.Do(func() { close(g.gate) }) }

// cluster is a standalone coordinator with its in-process workers.
type cluster struct {
	c     *standalone.Server
	url   string
	gates map[string]*gatedEngine // decode workers' engines by worker id, when gated
	// natsObserver may log in to the embedded NATS server, to read
	// heartbeats and plans.
	natsObserver control.NATSUser
	// planner is the online planner's host, when clusterOpts.planner
	// asked for one and it is on.
	planner *plannerhost.Host
}

type clusterOpts struct {
	mode            string
	prefill, decode int
	gated           bool // decode engines wrapped in gatedEngine, starting closed
	elastic         bool // workers started elastic (standalone.WithElasticWorkers)
	edit            func(*coordinator.Options)
	worker          func(*workerrun.Options)
	planner         func(*plannerhost.Options) // non-nil: run the online planner with these edits of its defaults
	log             *zap.Logger                // the coordinator's; nil: testLogger
	noWait          bool                       // return without waiting for the workers to be admitted
}

// startCluster starts a standalone coordinator on loopback with the tiny
// ref engine and waits until every worker has joined.
// clusterHashKey keys the block hashes of every cluster (startCluster):
// tests compute the hashes workers publish with it.
var clusterHashKey = kv.GenerateHashKey()

func startCluster(t testing.TB, co clusterOpts) *cluster {
	t.Helper()
	if co.mode == "" {
		co.mode = coordinator.ModeDisaggregated
	}
	if co.decode == 0 {
		co.decode = 1
	}
	if co.prefill == 0 && co.mode == coordinator.ModeDisaggregated {
		co.prefill = 1
	}
	cl := &cluster{gates: make(map[string]*gatedEngine), natsObserver: control.NewNATSUser(control.RoleObserver, "")}
	var mu sync.Mutex
	var engines []engine.Engine
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.NATSListen = "127.0.0.1:0", "127.0.0.1:-1"
	o.Standalone, o.Mode = true, co.mode
	o.NATSUsers = []control.NATSUser{cl.natsObserver}
	o.PrefillWorkers, o.DecodeWorkers = co.prefill, co.decode
	o.HeartbeatTTL = 2 * time.Second
	o.ShutdownTimeout = 10 * time.Second
	workerOpts := func(wo *workerrun.Options) {
		wo.Engine.Threads = testEngineThreads
		wo.HeartbeatInterval = 20 * time.Millisecond
		wo.DrainTimeout = 5 * time.Second
		// Small chunks, so that prompts prefill in several chunks.
		wo.Prefill.ChunkTokens, wo.Prefill.MaxBatchTokens = 16, 64
		wo.Decode.KVBlocks, wo.Decode.ChunkTokens, wo.Decode.MaxBatchTokens = 1024, 16, 256
		if co.gated && wo.Role != control.RolePrefill {
			eo := enginecfg.DefaultOptions()
			eo.Threads = testEngineThreads
			e, err := enginebuild.Build(eo)
			if err != nil {
				t.Fatal(err)
			}
			g := newGated(e)
			mu.Lock()
			engines = append(engines, e)
			cl.gates[wo.ID] = g
			mu.Unlock()
			wo.EngineOverride = g
		}
		if co.worker != nil {
			co.worker(wo)
		}
	}
	o.HashKey = clusterHashKey
	if co.edit != nil {
		co.edit(&o)
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	log := co.log
	if log == nil {
		log = testLogger(t)
	}
	if co.planner != nil {
		po := plannerhost.DefaultOptions()
		co.planner(&po)
		if err := po.Validate(o); err != nil {
			t.Fatal(err)
		}
		h, err := plannerhost.New(po, o, log)
		if err != nil {
			t.Fatal(err)
		}
		if h != nil {
			o.Extensions = append(o.Extensions, h)
			cl.planner = h
		}
	}
	sopts := []standalone.Option{standalone.WithWorkerOptions(workerOpts)}
	if co.elastic {
		sopts = append(sopts, standalone.WithElasticWorkers())
	}
	c, err := standalone.Start(context.Background(), o, log, sopts...)
	if err != nil {
		t.Fatal(err)
	}
	cl.c, cl.url = c, "http://"+c.HTTPAddr()
	t.Cleanup(func() {
		for _, g := range cl.gates {
			g.open()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		for _, e := range engines {
			enginebuild.Close(e)
		}
	})
	if co.noWait {
		return cl
	}
	want := map[control.Role]int{control.RolePrefill: co.prefill, control.RoleDecode: co.decode}
	if co.mode == coordinator.ModeColocated {
		want = map[control.Role]int{control.RoleColocated: co.decode}
	}
	waitFor(t, 10*time.Second, func() error {
		for role, n := range want {
			if got := len(c.Membership().Members(role)); got != n {
				return fmt.Errorf("%d %s workers joined, want %d", got, role, n)
			}
		}
		return c.Ready()
	})
	return cl
}

// testLogger logs warnings and errors to the test log.
func testLogger(t testing.TB) *zap.Logger {
	return zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
}

// gauge returns the value of a gathered gauge with label worker=id.
func gauge(t testing.TB, g prometheus.Gatherer, name, worker string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" && l.GetValue() == worker {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// idle returns nil once every worker holds no KV: each decode worker's
// free blocks equal its total, each prefill worker retains no bytes.
func (cl *cluster) idle(t testing.TB) error {
	for _, w := range cl.c.Workers() {
		if w.Role() == control.RolePrefill {
			if b, ok := gauge(t, cl.c.Registry(), "pdserve_prefill_retained_bytes", w.ID()); !ok || b != 0 {
				return fmt.Errorf("prefill worker %s retains %v bytes (found %v)", w.ID(), b, ok)
			}
			continue
		}
		free, ok1 := gauge(t, cl.c.Registry(), "pdserve_kv_blocks_free", w.ID())
		total, ok2 := gauge(t, cl.c.Registry(), "pdserve_kv_blocks_capacity", w.ID())
		if !ok1 || !ok2 || free != total {
			return fmt.Errorf("decode worker %s has %v of %v KV blocks free", w.ID(), free, total)
		}
	}
	return nil
}

// result is what a client got for one completion.
type result struct {
	Tokens []int32
	Text   string
	Finish string
	Budget map[string]any // the pdserve object
	Err    string         // error event of a stream
}

// request is a completion request body.
type request struct {
	Model          string   `json:"model,omitempty"`
	Prompt         any      `json:"prompt"`
	MaxTokens      int      `json:"max_tokens"`
	Temperature    float64  `json:"temperature"`
	Seed           *int64   `json:"seed,omitempty"`
	IgnoreEOS      bool     `json:"ignore_eos"`
	Stream         bool     `json:"stream"`
	ReturnTokenIDs bool     `json:"return_token_ids"`
	Stop           []string `json:"stop,omitempty"`
}

// complete sends a completion and collects the result; it fails the test
// on a non-200 status.
func complete(ctx context.Context, t testing.TB, url string, req request) result {
	t.Helper()
	req.ReturnTokenIDs = true
	resp := post(ctx, t, url+"/v1/completions", req)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if !req.Stream {
		var body struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason string  `json:"finish_reason"`
				TokenIDs     []int32 `json:"token_ids"`
			} `json:"choices"`
			PDServe map[string]any `json:"pdserve"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		c := body.Choices[0]
		return result{Tokens: c.TokenIDs, Text: c.Text, Finish: c.FinishReason, Budget: body.PDServe}
	}
	r, err := readStream(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readStream reads a completion event stream to its end.
func readStream(body io.Reader) (result, error) {
	var r result
	sc := bufio.NewScanner(body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || done {
			return r, fmt.Errorf("unexpected line %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ch struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
				TokenIDs     []int32 `json:"token_ids"`
			} `json:"choices"`
			PDServe map[string]any `json:"pdserve"`
			Error   *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return r, fmt.Errorf("chunk %q: %w", data, err)
		}
		if ch.Error != nil {
			r.Err = ch.Error.Message
			continue
		}
		for _, c := range ch.Choices {
			r.Text += c.Text
			r.Tokens = append(r.Tokens, c.TokenIDs...)
			if c.FinishReason != nil {
				r.Finish = *c.FinishReason
			}
		}
		if ch.PDServe != nil {
			r.Budget = ch.PDServe
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	if !done {
		return r, fmt.Errorf("stream ended without [DONE]")
	}
	return r, nil
}

func post(ctx context.Context, t testing.TB, url string, body any) *http.Response {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// reference runs the engine alone: prefill the prompt in one piece, then
// decode one token at a time, as the workers' output must be.
type reference struct {
	mu  sync.Mutex
	eng engine.Engine
	seq engine.SeqID
	// done holds generate's results by its arguments (refKey), for the
	// tests that ask the same of it in several modes of a cluster: the
	// engine's output is a function of them (a fresh sequence each
	// time), so it is computed once.
	done map[string][]int32
}

// refKey is generate's memo key for its arguments, "" when they have a
// penalty or a constraint (state that %v would not capture).
func refKey(prompt []int32, maxTokens int, s engine.Sampling, ignoreEOS bool) string {
	if s.Penalties != nil || s.Constraint != nil || s.Grammar != "" {
		return ""
	}
	return fmt.Sprintf("%v|%d|%+v|%v", prompt, maxTokens, s, ignoreEOS)
}

func newReference(t *testing.T) *reference {
	o := enginecfg.DefaultOptions()
	o.Threads = testEngineThreads
	return newReferenceOf(t, o)
}

// testEngineThreads is the matrix goroutines of the tests' tiny ref
// engines (startCluster's workers, newReference): with one per CPU, the
// default, every matrix product of a tiny model hands its rows to the
// pool and waits for them, wake-ups that cost more than the work on a
// loaded machine. The ref engine's output does not depend on it.
const testEngineThreads = 1

// newReferenceOf is newReference for the engine of o.
func newReferenceOf(t *testing.T, o enginecfg.Options) *reference {
	e, err := enginebuild.Build(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { enginebuild.Close(e) })
	return &reference{eng: e}
}

// generate returns the output tokens of prompt as a client sees them (a
// final EOS dropped).
func (r *reference) generate(t *testing.T, prompt []int32, maxTokens int, s engine.Sampling, ignoreEOS bool) []int32 {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	key := refKey(prompt, maxTokens, s, ignoreEOS)
	if got, ok := r.done[key]; ok && key != "" {
		return slices.Clone(got)
	}
	r.seq++
	seq := r.seq
	defer r.eng.Free(seq)
	ctx := context.Background()
	out, err := r.eng.Prefill(ctx, []engine.PrefillItem{{Seq: seq, Tokens: prompt, Sampling: s, Last: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eos := r.eng.Tokenizer().EOS()
	tok := out[0].Token
	toks := []int32{tok}
	for len(toks) < maxTokens && (ignoreEOS || tok != eos) {
		o, err := r.eng.Decode(ctx, []engine.DecodeItem{{Seq: seq, Token: tok, Sampling: s}})
		if err != nil {
			t.Fatal(err)
		}
		tok = o[0].Token
		toks = append(toks, tok)
	}
	if !ignoreEOS && toks[len(toks)-1] == eos {
		toks = toks[:len(toks)-1]
	}
	if key != "" {
		if r.done == nil {
			r.done = map[string][]int32{}
		}
		r.done[key] = slices.Clone(toks)
	}
	return toks
}

// clientText is the text a JSON client sees for tokens: their bytes, with
// invalid UTF-8 replaced as encoding/json does.
func clientText(t *testing.T, tok engine.Tokenizer, ids []int32) string {
	t.Helper()
	b, err := json.Marshal(tok.Decode(ids))
	if err != nil {
		t.Fatal(err)
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}
