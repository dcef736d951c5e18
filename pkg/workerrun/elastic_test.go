package workerrun

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/internal/repotest"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/gguf"
	"github.com/pdserve/pdserve/pkg/kv"
)

// elasticCluster is a prefill worker, a decode worker and an elastic
// worker (started decode) on an authenticated NATS server, and the
// coordinator's connection with its view of the heartbeats.
type elasticCluster struct {
	url     string
	p, d, e *Worker
	egated  *gatedEngine
	ereg    *prometheus.Registry
	coord   *nats.Conn
	members *control.Membership
	rogue   control.NATSUser // a decode worker's user
	pc, epc pdservev1.PrefillServiceClient
	dc, edc pdservev1.DecodeServiceClient
}

func startElasticCluster(t *testing.T, decodeFree int) *elasticCluster {
	t.Helper()
	return startElasticClusterOn(t, decodeFree, false)
}

// startElasticClusterOn is startElasticCluster; with forks the elastic
// worker's engine forks sequences (forkingGated), so that its roles keep
// prefix caches.
func startElasticClusterOn(t *testing.T, decodeFree int, forks bool) *elasticCluster {
	t.Helper()
	coord := control.NewNATSUser(control.RoleCoordinator, "")
	pu := control.NewNATSUser(control.RolePrefill, "p-0")
	du := control.NewNATSUser(control.RoleDecode, "d-0")
	eu := control.NewNATSUser(control.RoleElastic, "e-0")
	rogue := control.NewNATSUser(control.RoleDecode, "d-1")
	s, url, err := control.StartEmbedded("127.0.0.1:-1", control.WithUsers([]control.NATSUser{coord, pu, du, eu, rogue}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	c := &elasticCluster{url: url, rogue: rogue}
	po := testOptions(control.RolePrefill, url)
	po.ID, po.NATS = "p-0", pu.ConnOptions()
	do := testOptions(control.RoleDecode, url)
	do.ID, do.NATS = "d-0", du.ConnOptions()
	eo := testOptions(control.RoleDecode, url)
	eo.ID, eo.NATS, eo.Elastic = "e-0", eu.ConnOptions(), true
	c.egated = newGated(newEngine(t), decodeFree, -1)
	eo.EngineOverride = c.egated
	if forks {
		eo.EngineOverride = forkingGated{c.egated}
	}
	c.ereg = prometheus.NewRegistry()
	eo.Registerer = c.ereg
	c.p, c.d, c.e = startWorker(t, po), startWorker(t, do), startWorker(t, eo)

	c.coord, err = coord.ConnOptions().Connect(url, "coordinator", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.coord.Close)
	c.members = control.NewMembership(time.Minute)
	stop, err := control.Watch(context.Background(), c.coord, c.members, time.Now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	c.waitRole(t, "e-0", control.RoleDecode)
	c.waitRole(t, "p-0", control.RolePrefill)
	c.waitRole(t, "d-0", control.RoleDecode)
	c.pc = pdservev1.NewPrefillServiceClient(dial(t, c.p))
	c.dc = pdservev1.NewDecodeServiceClient(dial(t, c.d))
	ecc := dial(t, c.e)
	c.epc, c.edc = pdservev1.NewPrefillServiceClient(ecc), pdservev1.NewDecodeServiceClient(ecc)
	return c
}

// waitRole waits until the coordinator's view has id in role, not
// draining.
func (c *elasticCluster) waitRole(t *testing.T, id string, role control.Role) {
	t.Helper()
	poll.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		hb, ok := c.members.Get(id)
		if !ok || hb.Role != string(role) || hb.Draining {
			return fmt.Errorf("%s: %+v, want role %s, not draining", id, hb, role)
		}
		return nil
	})
}

// started is a request whose KV reached its decode worker and whose
// stream is open.
type started struct {
	prompt []int32
	first  int32 // the prefill worker's first token, which the stream does not carry
	gen    pdservev1.DecodeService_GenerateClient
}

// start runs a request's prefill on pc with its KV to the decode worker
// dc (at addr) and opens its stream. A Reserve error is returned as is
// (the coordinator retries UNAVAILABLE elsewhere).
func start(ctx context.Context, pc pdservev1.PrefillServiceClient, dc pdservev1.DecodeServiceClient, addr, id string, p []int32, maxTokens int) (started, error) {
	if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + maxTokens)}); err != nil {
		return started{}, err
	}
	gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: int32(maxTokens), IgnoreEos: true})
	if err != nil {
		return started{}, fmt.Errorf("generate %s: %w", id, err)
	}
	pre, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: addr})
	if err != nil {
		return started{}, fmt.Errorf("prefill %s: %w", id, err)
	}
	first, _, err := readPrefill(pre)
	if err != nil {
		return started{}, fmt.Errorf("prefill %s: %w", id, err)
	}
	if _, err := pc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: id}); err != nil {
		return started{}, fmt.Errorf("release %s: %w", id, err)
	}
	return started{prompt: p, first: first.GetToken(), gen: gen}, nil
}

// finish reads s's stream to its end and checks it against the engine
// alone, greedy.
func (s started) finish(t *testing.T, id string, maxTokens int) {
	t.Helper()
	got, err := readGenerate(s.gen, 0)
	if err != nil {
		t.Errorf("request %s: %v", id, err)
		return
	}
	if diff := cmp.Diff(reference(t, s.prompt, maxTokens), append([]int32{s.first}, got.tokens...)); diff != "" {
		t.Errorf("request %s tokens (-engine alone +served):\n%s", id, diff)
	}
}

// TestElasticWorkerChangesRoleUnderLoad moves a decode worker to prefill
// while it decodes three sequences, and back: the running sequences
// finish token-exact, a request that reaches it while it drains gets
// UNAVAILABLE (and is served by the other decode worker), the
// coordinator sees the new role from the next heartbeat, requests in the
// new role are token-exact, the engine holds no sequence beyond its
// prefix cache's, and the time to the first request in the new role is
// observed.
func TestElasticWorkerChangesRoleUnderLoad(t *testing.T) {
	const maxTokens = 12
	c := startElasticCluster(t, 2) // the elastic worker's third decode step waits for the gate
	t.Cleanup(c.egated.open)
	ctx := testCtx(t)

	// Three sequences decode on the elastic worker, held at a step.
	var running []started
	for i := range 3 {
		id := fmt.Sprint("run-", i)
		s, err := start(ctx, c.pc, c.edc, c.e.Addr(), id, prompt(9+2*i, int32(i+1)), maxTokens)
		if err != nil {
			t.Fatal(err)
		}
		running = append(running, s)
	}
	poll.WaitFor(t, "the elastic worker's decode steps held", func() bool { d, _, _ := c.egated.counts(); return d > 2 })

	if err := control.SendCommand(ctx, c.coord, string(control.RoleDecode), "e-0", control.Command{Kind: control.CmdRole, Arg: "nonsense"}); !errors.Is(err, control.ErrCommandFailed) {
		t.Errorf("role command to an unknown role: %v, want ErrCommandFailed", err)
	}
	if err := control.SendCommand(ctx, c.coord, string(control.RoleDecode), "e-0", control.Command{Kind: control.CmdRole, Arg: string(control.RolePrefill)}); err != nil {
		t.Fatal(err)
	}
	// Draining: the heartbeat says so, and new decode work is refused
	// with UNAVAILABLE, which the coordinator retries on the other
	// decode worker.
	poll.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if hb, _ := c.members.Get("e-0"); !hb.Draining {
			return errors.New("e-0 not draining")
		}
		return nil
	})
	p := prompt(14, 7)
	if _, err := start(ctx, c.pc, c.edc, c.e.Addr(), "late", p, maxTokens); status.Code(err) != codes.Unavailable {
		t.Fatalf("reserve on the draining worker: %v, want UNAVAILABLE", err)
	}
	late, err := start(ctx, c.pc, c.dc, c.d.Addr(), "late", p, maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	if c.e.Role() != control.RoleDecode {
		t.Errorf("role %s while the old role drains, want decode", c.e.Role())
	}
	c.egated.open()
	var wg sync.WaitGroup
	for i, s := range running {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.finish(t, fmt.Sprint("run-", i), maxTokens)
		}()
	}
	late.finish(t, "late", maxTokens)
	wg.Wait()

	// Prefill from the next heartbeat on; decode calls are refused.
	c.waitRole(t, "e-0", control.RolePrefill)
	if c.e.Role() != control.RolePrefill {
		t.Errorf("Role() = %s, want prefill", c.e.Role())
	}
	if _, err := c.edc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "x", Tokens: 10}); status.Code(err) != codes.Unavailable {
		t.Errorf("reserve on the worker turned prefill: %v, want UNAVAILABLE", err)
	}
	for i := range 2 {
		id := fmt.Sprint("pre-", i)
		s, err := start(ctx, c.epc, c.dc, c.d.Addr(), id, prompt(11+i, int32(20+i)), maxTokens)
		if err != nil {
			t.Fatal(err)
		}
		s.finish(t, id, maxTokens)
	}
	if n, err := testutil.GatherAndCount(c.ereg, "pdserve_worker_role_change_first_request_seconds"); err != nil || n != 1 {
		t.Errorf("first-request histograms: %d (%v), want 1 (prefill)", n, err)
	}
	if v := testutil.ToFloat64(c.e.rm.role.WithLabelValues("prefill")); v != 1 {
		t.Errorf("pdserve_worker_role{role=prefill} = %v, want 1", v)
	}

	// And back to decode: the decode server's metrics register again.
	if err := control.SendCommand(ctx, c.coord, string(control.RolePrefill), "e-0", control.Command{Kind: control.CmdRole, Arg: string(control.RoleDecode)}); err != nil {
		t.Fatal(err)
	}
	c.waitRole(t, "e-0", control.RoleDecode)
	s, err := start(ctx, c.pc, c.edc, c.e.Addr(), "back", prompt(10, 3), maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	s.finish(t, "back", maxTokens)
	if err := c.e.Err(); err != nil {
		t.Errorf("elastic worker failed: %v", err)
	}
	if v := testutil.ToFloat64(c.e.rm.changes.WithLabelValues("prefill", "decode")); v != 1 {
		t.Errorf("changes prefill→decode = %v, want 1", v)
	}

	// Nothing is left in the engine but what the prefix cache holds.
	ds := c.e.cur().svc.(decodeService)
	poll.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		st := ds.Stats()
		_, _, live := c.egated.counts()
		if st.Requests != 0 || st.KVBlocksFree != st.KVBlocksTotal || live != st.PrefixCache.Entries {
			return fmt.Errorf("requests %d, blocks free %d of %d, engine sequences %d, cached %d", st.Requests, st.KVBlocksFree, st.KVBlocksTotal, live, st.PrefixCache.Entries)
		}
		return nil
	})
}

// TestRoleCommandOnlyFromCoordinator: another user's role command never
// reaches the worker (NATS refuses the publish); a worker not started
// elastic refuses the coordinator's.
func TestRoleCommandOnlyFromCoordinator(t *testing.T) {
	c := startElasticCluster(t, -1)
	ctx := testCtx(t)
	var mu sync.Mutex
	var violations []string
	nc, err := c.rogue.ConnOptions().Connect(c.url, "rogue", nil, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		violations = append(violations, err.Error())
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	poll.WaitFor(t, "rogue connected", nc.IsConnected)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := control.SendCommand(rctx, nc, string(control.RoleDecode), "e-0", control.Command{Kind: control.CmdRole, Arg: "prefill"}); err == nil {
		t.Fatal("a decode worker's role command was answered")
	}
	poll.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, v := range violations {
			if strings.Contains(v, `Permissions Violation for Publish to "pdserve.cmd.decode.e-0"`) {
				return nil
			}
		}
		return fmt.Errorf("no permission violation yet: %q", violations)
	})
	if err := control.SendCommand(ctx, c.coord, string(control.RoleDecode), "d-0", control.Command{Kind: control.CmdRole, Arg: "prefill"}); !errors.Is(err, control.ErrCommandFailed) || !strings.Contains(err.Error(), "not started elastic") {
		t.Errorf("role command to a worker not elastic: %v", err)
	}
	// Any heartbeat now was published after the violation: still decode.
	hb := c.e.heartbeat()
	if hb.Role != string(control.RoleDecode) || hb.Draining || c.e.changing.Load() {
		t.Errorf("elastic worker after the refused command: role %s, draining %v", hb.Role, hb.Draining)
	}
}

// BenchmarkRoleChangeSim moves an idle elastic worker on the sim engine
// (h100/llama-3-8b, real step times, KV payload scaled down) between
// decode and prefill, as the coordinator would: the role command on
// NATS, the new role seen in its heartbeat, then a request in the new
// role (as prefill: a 512-token prompt whose KV goes to a fixed decode
// worker; as decode: a 512-token prompt prefilled locally), to its first
// token. ns/op is the whole, command to first token; s_visible the
// command to the heartbeat of the new role; s_baseline_first_token the
// first token of the decode role's request (another prompt) on the
// fixed decode worker: the request's own time, the third of three.
//
//	go test -run '^$' -bench BenchmarkRoleChangeSim -benchtime 20x ./pkg/workerrun/
func BenchmarkRoleChangeSim(b *testing.B) {
	eo := enginecfg.Options{Engine: enginecfg.Sim, Profile: "h100/llama-3-8b/tp1", TimeScale: 1, PayloadScale: 1.0 / 1024, Seed: 3}
	benchRoleChange(b, eo, 512, 1024)
}

// BenchmarkRoleChangeLlama is BenchmarkRoleChangeSim on the llama.cpp
// engine (CPU here) with a small model: random weights of a real
// architecture (llama, 4 layers, hidden 256, F16) over llama's
// vocabulary, a 4k-token KV cache; 128-token prompts, 1 thread. The model stays loaded
// across the moves: ns/op is the drain, the new role's server, the
// heartbeat and the request's first token, against
// s_baseline_first_token (the same request on the fixed decode worker).
//
//	make llama
//	go test -run '^$' -bench BenchmarkRoleChangeLlama -benchtime 20x ./pkg/workerrun/
func BenchmarkRoleChangeLlama(b *testing.B) {
	lib, vocab := repotest.Llama(b)
	model := filepath.Join(b.TempDir(), "bench.gguf")
	if err := gguf.WriteRandom(model, gguf.RandomOptions{Arch: "llama", Vocab: filepath.Join(vocab, "ggml-vocab-llama-spm.gguf"),
		Layers: 4, Hidden: 256, Heads: 8, KVHeads: 4, FFN: 512, Context: 4096, Type: gguf.F16, Seed: 7}); err != nil {
		b.Fatal(err)
	}
	eo := enginecfg.DefaultOptions()
	eo.Engine, eo.Model, eo.LlamaLib, eo.CtxSize, eo.MaxSeqs, eo.Threads = enginecfg.Llama, model, lib, 4096, 16, 1
	benchRoleChange(b, eo, 128, 128)
}

// benchRoleChange runs the role change benchmark on engine eo with
// prompts of n tokens and decode pools of kvBlocks blocks.
func benchRoleChange(b *testing.B, eo enginecfg.Options, n, kvBlocks int) {
	url := startNATS(b)
	// The default chunking (the tests' 8-token chunks would take a step
	// per 8 prompt tokens).
	chunks := func(o *Options) {
		def := NewDecodeOptions()
		o.Prefill.ChunkTokens, o.Prefill.MaxBatchTokens = def.Prefill.ChunkTokens, def.Prefill.MaxBatchTokens
		o.Decode.ChunkTokens, o.Decode.MaxBatchTokens = def.Decode.ChunkTokens, def.Decode.MaxBatchTokens
		o.Decode.KVBlocks = kvBlocks
	}
	do := testOptions(control.RoleDecode, url)
	do.ID, do.Engine, do.MetricsAddr = "d-0", eo, ""
	chunks(&do)
	o := testOptions(control.RoleDecode, url)
	o.ID, o.Engine, o.Elastic, o.MetricsAddr = "e-0", eo, true, ""
	chunks(&o)
	d, e := startWorker(b, do), startWorker(b, o)
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	m := control.NewMembership(time.Minute)
	stop, err := control.Watch(context.Background(), nc, m, time.Now, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	ecc := dial(b, e)
	epc, edc := pdservev1.NewPrefillServiceClient(ecc), pdservev1.NewDecodeServiceClient(ecc)
	dc := pdservev1.NewDecodeServiceClient(dial(b, d))
	ctx := testCtx(b)
	p := prompt(n, 5)
	var visible time.Duration
	b.ResetTimer()
	for i := range b.N {
		to := control.RolePrefill
		if i%2 == 1 {
			to = control.RoleDecode
		}
		t0 := time.Now()
		if err := control.SendCommand(ctx, nc, string(e.Role()), "e-0", control.Command{Kind: control.CmdRole, Arg: string(to)}); err != nil {
			b.Fatal(err)
		}
		for {
			if hb, ok := m.Get("e-0"); ok && hb.Role == string(to) && !hb.Draining {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		visible += time.Since(t0)
		id := fmt.Sprint("r-", i)
		var gen pdservev1.DecodeService_GenerateClient
		if to == control.RolePrefill {
			if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + 2)}); err != nil {
				b.Fatal(err)
			}
			if gen, err = dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 2, IgnoreEos: true}); err != nil {
				b.Fatal(err)
			}
			pre, err := epc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: d.Addr()})
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := readPrefill(pre); err != nil {
				b.Fatal(err)
			}
			if _, err := epc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: id}); err != nil {
				b.Fatal(err)
			}
		} else {
			if _, err := edc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + 2)}); err != nil {
				b.Fatal(err)
			}
			if gen, err = edc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: 2, IgnoreEos: true, LocalPrefill: true}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := readGenerate(gen, 1); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if _, err := readGenerate(gen, 0); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	// The same request on a worker that changed nothing, as the floor
	// (after the loop: the workers' codec self-benchmarks are over).
	var baseline time.Duration
	for i := range 3 {
		id := fmt.Sprint("base-", i)
		bp := prompt(n, int32(100+i)) // a prompt of its own: no prefix cache hit
		t0 := time.Now()
		if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(bp) + 2)}); err != nil {
			b.Fatal(err)
		}
		gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: bp, MaxTokens: 2, IgnoreEos: true, LocalPrefill: true})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := readGenerate(gen, 1); err != nil {
			b.Fatal(err)
		}
		baseline = time.Since(t0)
		if _, err := readGenerate(gen, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(visible.Seconds()/float64(b.N), "s_visible")
	b.ReportMetric(baseline.Seconds(), "s_baseline_first_token")
}

// TestElasticRoleChangeKeepsPrefixCache: what an elastic worker cached in
// one role serves the next one, both ways, without a copy. As decode it
// prefills a prompt locally; moved to prefill, a prompt sharing its first
// three blocks starts from them (the prefill's hit, engine tier) and
// decodes token-exact on the fixed decode worker; the prompts it
// prefilled there, moved back to decode, are its cache again (a Reserve
// holds a prompt's shared blocks: prefix_hit_tokens, and the KV from the
// fixed prefill worker skips them), token-exact. Each time a
// coordinator's KV index (admitting the role its membership has, as the
// coordinator's does) finds the kept blocks under the new role. The
// engine holds nothing after but the cache's sequences.
//
// It fails without the handover: each new role starts with an empty
// cache (hit 0, the index has nothing of the worker).
func TestElasticRoleChangeKeepsPrefixCache(t *testing.T) {
	const maxTokens = 6
	c := startElasticClusterOn(t, -1, true)
	ctx := testCtx(t)
	// A stale view asks the worker for a snapshot, as the coordinator's
	// does (the worker's first one was before the watch).
	var asks sync.WaitGroup
	t.Cleanup(asks.Wait)
	ix, err := control.NewKVIndexWith(control.KVIndexOptions{
		MaxBytes: control.DefaultKVIndexMaxBytes, WorkerMaxBytes: control.DefaultKVIndexWorkerMaxBytes,
		Admitted: func(role, id string) bool { r, ok := c.members.Admitted(id); return ok && r == role },
		OnStale: func(role, id string) {
			asks.Go(func() { _ = control.SendCommand(ctx, c.coord, role, id, control.Command{Kind: control.CmdKVSnapshot}) })
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := control.WatchKV(context.Background(), c.coord, ix, c.members, 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	bt := c.e.o.Decode.BlockTokens
	if pbt := c.e.o.Prefill.PrefixCache.BlockTokens; pbt != bt {
		t.Fatalf("block sizes differ: prefill %d, decode %d", pbt, bt)
	}
	indexedAs := func(role control.Role, p []int32) {
		t.Helper()
		hs := kv.HashBlocks(0, p, bt)
		poll.CheckFor(t, 30*time.Second, 5*time.Millisecond, func() error {
			v := ix.Blocks("e-0")
			if v == nil {
				return errors.New("no view of e-0")
			}
			if st := v.State(); st.Role != string(role) || !st.Synced {
				return fmt.Errorf("e-0's view %+v, want a snapshot of role %s", st, role)
			}
			for _, h := range hs {
				if !v.Has(uint64(h)) {
					return fmt.Errorf("e-0's view (%+v) lacks block %x", v.State(), h)
				}
			}
			if hb, _ := c.members.Get("e-0"); hb.Role != string(role) {
				return fmt.Errorf("e-0 is %s in the membership, want %s", hb.Role, role)
			}
			return nil
		})
	}
	// sharing returns a prompt of p's first three blocks and its own tail.
	sharing := func(p []int32, seed int32) []int32 {
		return append(slices.Clone(p[:3*bt]), prompt(bt+5, seed)...)
	}

	// Decode: a local prefill, kept in the decode role's cache.
	a := prompt(4*bt, 31)
	gen, err := c.edc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "a", PromptTokens: a, MaxTokens: 1, IgnoreEos: true, LocalPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readGenerate(gen, 0); err != nil {
		t.Fatal(err)
	}
	indexedAs(control.RoleDecode, a)

	// Prefill: the decode role's cache serves the prefill.
	if err := control.SendCommand(ctx, c.coord, string(control.RoleDecode), "e-0", control.Command{Kind: control.CmdRole, Arg: string(control.RolePrefill)}); err != nil {
		t.Fatal(err)
	}
	c.waitRole(t, "e-0", control.RolePrefill)
	indexedAs(control.RolePrefill, a)
	a2 := sharing(a, 32)
	if _, err := c.dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "a2", Tokens: int32(len(a2) + maxTokens)}); err != nil {
		t.Fatal(err)
	}
	gen, err = c.dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "a2", PromptTokens: a2, MaxTokens: maxTokens, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	pre, err := c.epc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "a2", PromptTokens: a2, DecodeAddr: c.d.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	first, _, err := readPrefill(pre)
	if err != nil {
		t.Fatal(err)
	}
	if hit := first.GetHit(); hit.GetTokens() != int32(3*bt) || hit.GetHostTokens() != 0 {
		t.Errorf("prefill after the role change: hit %v, want %d tokens from the engine tier", hit, 3*bt)
	}
	if _, err := c.epc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: "a2"}); err != nil {
		t.Fatal(err)
	}
	started{prompt: a2, first: first.GetToken(), gen: gen}.finish(t, "a2", maxTokens)
	// b, prefilled here, is the prefill role's cache.
	b := prompt(4*bt, 41)
	s, err := start(ctx, c.epc, c.dc, c.d.Addr(), "b", b, maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	s.finish(t, "b", maxTokens)

	// Decode again: the prefill role's cache serves the KV import.
	if err := control.SendCommand(ctx, c.coord, string(control.RolePrefill), "e-0", control.Command{Kind: control.CmdRole, Arg: string(control.RoleDecode)}); err != nil {
		t.Fatal(err)
	}
	c.waitRole(t, "e-0", control.RoleDecode)
	indexedAs(control.RoleDecode, b)
	b2 := sharing(b, 42)
	res, err := c.edc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "b2", Tokens: int32(len(b2) + maxTokens), Prompt: b2})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetPrefixHitTokens() != int32(3*bt) {
		t.Errorf("reserve after the role change: prefix_hit_tokens %d, want %d", res.GetPrefixHitTokens(), 3*bt)
	}
	gen, err = c.edc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "b2", PromptTokens: b2, MaxTokens: maxTokens, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	pre, err = c.pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "b2", PromptTokens: b2, DecodeAddr: c.e.Addr(), SkipTokens: res.GetPrefixHitTokens()})
	if err != nil {
		t.Fatal(err)
	}
	first, _, err = readPrefill(pre)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.pc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: "b2"}); err != nil {
		t.Fatal(err)
	}
	started{prompt: b2, first: first.GetToken(), gen: gen}.finish(t, "b2", maxTokens)
	if err := c.e.Err(); err != nil {
		t.Errorf("elastic worker failed: %v", err)
	}

	// Nothing is left in the engine but what the prefix cache holds.
	ds := c.e.cur().svc.(decodeService)
	poll.CheckFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		st := ds.Stats()
		_, _, live := c.egated.counts()
		if st.Requests != 0 || live != st.PrefixCache.Entries || st.PrefixCache.Adopted == 0 {
			return fmt.Errorf("requests %d, engine sequences %d, cached %d (%d adopted)", st.Requests, live, st.PrefixCache.Entries, st.PrefixCache.Adopted)
		}
		return nil
	})
}

// TestRoleChangeFailsWithoutHanging: a role change whose new role cannot
// connect (its NATS connection is closed) returns an error and fails the
// worker; it used to wait forever for the new role's scheduler, which
// never started.
func TestRoleChangeFailsWithoutHanging(t *testing.T) {
	s, url, err := control.StartEmbedded("127.0.0.1:-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	o := testOptions(control.RoleDecode, url)
	o.ID, o.Elastic = "e-0", true
	w, err := Start(testCtx(t), o, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	w.nc.Close()
	done := make(chan error, 1)
	go func() { done <- w.ChangeRole(control.RolePrefill, time.Now(), false) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("role change with a closed NATS connection: no error")
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("role change with a closed NATS connection did not return in 2 minutes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.Stop(ctx); err == nil {
		t.Error("the worker whose role change failed stopped without its error")
	}
	select {
	case <-w.Done():
	default:
		t.Error("the worker whose role change failed is not done")
	}
}
