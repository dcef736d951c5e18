package workerrun

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/decode"
	"github.com/pdserve/pdserve/pkg/enginebuild"
	"github.com/pdserve/pdserve/pkg/enginecfg"
	"github.com/pdserve/pdserve/pkg/wire"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// disaggregated runs one request through a prefill worker and a decode
// worker as the coordinator does: Reserve, then Generate and Prefill
// concurrently. It returns the decode worker's result, its tokens
// preceded by the prefill worker's first token (which the decode stream
// does not carry with remote KV), and that first token.
func disaggregated(t *testing.T, ctx context.Context, pc pdservev1.PrefillServiceClient, dc pdservev1.DecodeServiceClient, decodeAddr, id string, p []int32, maxTokens int, codecName string) (genResult, int32) {
	t.Helper()
	if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(p) + maxTokens)}); err != nil {
		t.Fatal(err)
	}
	gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: int32(maxTokens), IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	pre, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: decodeAddr, Codec: codecName})
	if err != nil {
		t.Fatal(err)
	}
	first, done, err := readPrefill(pre)
	if err != nil {
		t.Fatalf("prefill %s: %v", id, err)
	}
	if first == nil || done == nil || done.GetBytesRaw() == 0 {
		t.Fatalf("prefill %s: first token %v, kv done %v", id, first, done)
	}
	res, err := readGenerate(gen, 0)
	if err != nil {
		t.Fatalf("generate %s: %v", id, err)
	}
	res.tokens = append([]int32{first.GetToken()}, res.tokens...)
	return res, first.GetToken()
}

func TestDisaggregatedMatchesEngine(t *testing.T) {
	url := startNATS(t)
	pw := startWorker(t, testOptions(control.RolePrefill, url))
	dw := startWorker(t, testOptions(control.RoleDecode, url))
	pc := pdservev1.NewPrefillServiceClient(dial(t, pw))
	dc := pdservev1.NewDecodeServiceClient(dial(t, dw))
	ctx := testCtx(t)
	for _, tc := range []struct {
		name  string
		n     int
		max   int
		codec string
	}{
		{"short", 5, 8, "none"},
		{"chunked zstd", 29, 12, "zstd"},
		{"bf16 codec", 17, 6, "bf16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prompt(tc.n, int32(tc.n))
			want := reference(t, p, tc.max)
			got, first := disaggregated(t, ctx, pc, dc, dw.Addr(), tc.name, p, tc.max, tc.codec)
			if first != want[0] {
				t.Errorf("prefill worker's first token %d, engine alone %d", first, want[0])
			}
			if diff := cmp.Diff(want, got.tokens); diff != "" {
				t.Errorf("tokens (-engine alone +disaggregated):\n%s", diff)
			}
			for _, s := range []vocab.Stamp{decode.StampKVFirstByte, decode.StampKVDone, decode.StampJoined, decode.StampFirstToken, decode.StampLastToken} {
				if got.stamps[wire.StampKind(s)] == 0 {
					t.Errorf("stamp %v missing", wire.StampKind(s))
				}
			}
			if _, err := pc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: tc.name}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSimEngineWorkers runs the performance-model engine, with a
// scaled-down KV payload, through both workers.
func TestSimEngineWorkers(t *testing.T) {
	url := startNATS(t)
	eo := enginecfg.Options{Engine: enginecfg.Sim, Profile: "h100/llama-3-8b/tp1", TimeScale: 0.001, PayloadScale: 0.01, Seed: 3}
	po := testOptions(control.RolePrefill, url)
	po.Engine = eo
	do := testOptions(control.RoleDecode, url)
	do.Engine = eo
	pw := startWorker(t, po)
	dw := startWorker(t, do)
	alone, err := enginebuild.Build(eo)
	if err != nil {
		t.Fatal(err)
	}
	p := prompt(40, 2)
	want := referenceOn(t, alone, p, 8)
	pc := pdservev1.NewPrefillServiceClient(dial(t, pw))
	dc := pdservev1.NewDecodeServiceClient(dial(t, dw))
	got, _ := disaggregated(t, testCtx(t), pc, dc, dw.Addr(), "sim", p, 8, "zstd")
	if diff := cmp.Diff(want, got.tokens); diff != "" {
		t.Errorf("tokens (-sim engine alone +disaggregated):\n%s", diff)
	}
	// Having measured a step, the prefill worker offers the router its
	// pull cost (pulls are on by default); the decode worker pulls none.
	if c := pw.heartbeat().PeerPullCost; !(c > 0) {
		t.Errorf("prefill heartbeat's peer_pull_cost after a step: %v, want > 0", c)
	}
	if c := dw.heartbeat().PeerPullCost; c != 0 {
		t.Errorf("decode heartbeat's peer_pull_cost: %v, want 0", c)
	}
}

func TestColocatedWorkerMatchesEngine(t *testing.T) {
	o := testOptions(control.RoleColocated, "")
	o.MetricsAddr = ""
	w := startWorker(t, o)
	dc := pdservev1.NewDecodeServiceClient(dial(t, w))
	p := prompt(23, 4)
	want := reference(t, p, 10)
	gen, err := dc.Generate(testCtx(t), &pdservev1.GenerateRequest{RequestId: "c", PromptTokens: p, MaxTokens: 10, IgnoreEos: true, LocalPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := readGenerate(gen, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got.tokens); diff != "" {
		t.Errorf("tokens (-engine alone +colocated):\n%s", diff)
	}
}

// TestConcurrentRequestsBatch runs several requests on one decode worker
// and checks they share steps. The KV of all lands first; the first Generate
// call joins and its first decode step is held by a gated engine until the
// other calls wait to join, so the next step holds all of them whatever the
// timing.
func TestConcurrentRequestsBatch(t *testing.T) {
	url := startNATS(t)
	pw := startWorker(t, testOptions(control.RolePrefill, url))
	do := testOptions(control.RoleDecode, url)
	gated := newGated(newEngine(t), 0, -1) // every decode step waits for the gate
	do.EngineOverride = gated
	dw := startWorker(t, do)
	pc := pdservev1.NewPrefillServiceClient(dial(t, pw))
	dc := pdservev1.NewDecodeServiceClient(dial(t, dw))
	ds := dw.cur().svc.(decodeService)
	ctx := testCtx(t)
	const n = 3
	prompts := make([][]int32, n)
	firsts := make([]int32, n) // the prefill worker's first tokens, which the decode streams do not carry
	for i := range n {
		id := fmt.Sprint("req-", i)
		prompts[i] = prompt(6+3*i, int32(i+1))
		if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: int32(len(prompts[i]) + 6)}); err != nil {
			t.Fatal(err)
		}
		pre, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: id, PromptTokens: prompts[i], DecodeAddr: dw.Addr()})
		if err != nil {
			t.Fatal(err)
		}
		first, _, err := readPrefill(pre)
		if err != nil {
			t.Fatal(err)
		}
		firsts[i] = first.GetToken()
	}
	var wg sync.WaitGroup
	results := make([]genResult, n)
	errs := make([]error, n)
	for i := range n {
		gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: fmt.Sprint("req-", i), PromptTokens: prompts[i], MaxTokens: 6, IgnoreEos: true})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			poll.WaitFor(t, "first decode step", func() bool { decodes, _, _ := gated.counts(); return decodes == 1 })
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = readGenerate(gen, 0)
		}()
	}
	poll.WaitFor(t, "the others waiting to join", func() bool { return ds.Stats().Waiting == n-1 })
	gated.open()
	wg.Wait()
	maxBatch := int32(0)
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if diff := cmp.Diff(reference(t, prompts[i], 6), append([]int32{firsts[i]}, results[i].tokens...)); diff != "" {
			t.Errorf("request %d tokens (-engine alone +batched):\n%s", i, diff)
		}
		for _, b := range results[i].batches {
			maxBatch = max(maxBatch, b)
		}
	}
	if maxBatch != n {
		t.Errorf("largest batch %d, want %d", maxBatch, n)
	}
}

func TestCancelFreesBothWorkers(t *testing.T) {
	url := startNATS(t)
	po := testOptions(control.RolePrefill, url)
	pgated := newGated(newEngine(t), -1, -1)
	pgated.prefillFree = 1 // the first 8-token chunk is prefilled and sent, the second waits
	t.Cleanup(pgated.open)
	po.EngineOverride = pgated
	pw := startWorker(t, po)
	dw := startWorker(t, testOptions(control.RoleDecode, url))
	pc := pdservev1.NewPrefillServiceClient(dial(t, pw))
	dc := pdservev1.NewDecodeServiceClient(dial(t, dw))
	ds := dw.cur().svc.(decodeService)
	total := ds.Stats().KVBlocksTotal

	// Cancel while the KV is being transferred (the decode worker holds the
	// first chunk's KV staged, the rest is not computed yet): the client
	// goes away from both calls, as the coordinator does on a client
	// disconnect.
	ctx, cancel := context.WithCancel(testCtx(t))
	p := prompt(20, 9)
	if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "x", Tokens: 40}); err != nil {
		t.Fatal(err)
	}
	gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "x", PromptTokens: p, MaxTokens: 20})
	if err != nil {
		t.Fatal(err)
	}
	pre, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "x", PromptTokens: p, DecodeAddr: dw.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, "transfer in progress", func() bool { return ds.Stats().StagedKVBytes > 0 })
	cancel()
	if _, _, err := readPrefill(pre); status.Code(err) != codes.Canceled {
		t.Errorf("prefill after cancel: %v, want CANCELED", err)
	}
	if _, err := readGenerate(gen, 0); status.Code(err) != codes.Canceled {
		t.Errorf("generate after cancel: %v, want CANCELED", err)
	}
	poll.WaitFor(t, "decode worker idle", func() bool {
		st := ds.Stats()
		return st.KVBlocksFree == total && st.Requests == 0 && st.StagedKVBytes == 0
	})
	pgated.open()
	ps := pw.cur().svc.(prefillService)
	poll.WaitFor(t, "prefill worker idle", func() bool {
		st := ps.Stats()
		_, _, live := pgated.counts()
		return st.Live == 0 && st.RetainedBytes == 0 && live == 0
	})

	// Cancel mid-stream, after tokens flowed; Release drops the prefill
	// worker's copy.
	ctx2, cancel2 := context.WithCancel(testCtx(t))
	defer cancel2()
	if _, err := dc.Reserve(ctx2, &pdservev1.ReserveRequest{RequestId: "y", Tokens: 300}); err != nil {
		t.Fatal(err)
	}
	gen, err = dc.Generate(ctx2, &pdservev1.GenerateRequest{RequestId: "y", PromptTokens: p, MaxTokens: 280, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	pre, err = pc.Prefill(ctx2, &pdservev1.PrefillRequest{RequestId: "y", PromptTokens: p, DecodeAddr: dw.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := readPrefill(pre); err != nil {
		t.Fatal(err)
	}
	if _, err := readGenerate(gen, 2); err != nil {
		t.Fatal(err)
	}
	cancel2()
	if _, err := pc.Release(testCtx(t), &pdservev1.ReleaseRequest{RequestId: "y"}); err != nil {
		t.Fatal(err)
	}
	poll.WaitFor(t, "both workers idle", func() bool {
		st := ds.Stats()
		pst := ps.Stats()
		return st.KVBlocksFree == total && st.Requests == 0 && st.StagedKVBytes == 0 && pst.Live == 0 && pst.RetainedBytes == 0
	})
}

// TestRecoveryAfterDecodeWorkerDies kills the decode worker mid-request; the
// KV retained by the prefill worker is re-sent to a second decode worker,
// which re-prefills the tokens already streamed and finishes the request
// with the tokens of the engine alone.
func TestRecoveryAfterDecodeWorkerDies(t *testing.T) {
	url := startNATS(t)
	reg := prometheus.NewRegistry() // both decode workers share it, as in-process workers do
	pw := startWorker(t, testOptions(control.RolePrefill, url))
	o1 := testOptions(control.RoleDecode, url)
	o1.Registerer = reg
	gated := newGated(newEngine(t), 3, -1) // decode steps after the third wait
	o1.EngineOverride = gated
	d1 := startWorker(t, o1)
	o2 := testOptions(control.RoleDecode, url)
	o2.Registerer = reg
	d2 := startWorker(t, o2)
	pc := pdservev1.NewPrefillServiceClient(dial(t, pw))
	c1 := pdservev1.NewDecodeServiceClient(dial(t, d1))
	c2 := pdservev1.NewDecodeServiceClient(dial(t, d2))
	ctx := testCtx(t)

	p := prompt(17, 11)
	const maxTokens = 12
	want := reference(t, p, maxTokens)
	if _, err := c1.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: int32(len(p) + maxTokens)}); err != nil {
		t.Fatal(err)
	}
	gen, err := c1.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "r", PromptTokens: p, MaxTokens: maxTokens, IgnoreEos: true})
	if err != nil {
		t.Fatal(err)
	}
	pre, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: "r", PromptTokens: p, DecodeAddr: d1.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	first, _, err := readPrefill(pre)
	if err != nil {
		t.Fatal(err)
	}
	// Three decode steps after the prefill worker's first token (which
	// the stream does not carry), then the worker hangs.
	before, err := readGenerate(gen, 3)
	if err != nil {
		t.Fatal(err)
	}
	before.tokens = append([]int32{first.GetToken()}, before.tokens...)
	if err := d1.Kill(); err != nil {
		t.Errorf("kill: %v", err)
	}
	if _, err := readGenerate(gen, 0); status.Code(err) != codes.Unavailable {
		t.Errorf("generate on the killed worker: %v, want UNAVAILABLE", err)
	}

	// Recovery on the second decode worker.
	if _, err := c2.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: int32(len(p) + maxTokens)}); err != nil {
		t.Fatal(err)
	}
	resent, err := pc.Resend(ctx, &pdservev1.ResendRequest{RequestId: "r", DecodeAddr: d2.Addr()})
	if err != nil {
		t.Fatalf("resend: %v", err)
	}
	if resent.GetKvDone().GetBytesRaw() == 0 {
		t.Errorf("resend kv done %+v", resent.GetKvDone())
	}
	gen2, err := c2.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "r", PromptTokens: p, MaxTokens: maxTokens, IgnoreEos: true, GeneratedTokens: before.tokens})
	if err != nil {
		t.Fatal(err)
	}
	after, err := readGenerate(gen2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, append(before.tokens, after.tokens...)); diff != "" {
		t.Errorf("tokens before and after recovery (-engine alone +recovered):\n%s", diff)
	}
	if after.reason != decode.FinishLength {
		t.Errorf("finish reason %q", after.reason)
	}
	if _, err := pc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: "r"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Resend(ctx, &pdservev1.ResendRequest{RequestId: "r", DecodeAddr: d2.Addr()}); status.Code(err) != codes.NotFound {
		t.Errorf("resend after release: %v, want NOT_FOUND", err)
	}
	// Both decode workers' metrics live in the shared registry, apart.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	workers := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "pdserve_kv_blocks_capacity" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" {
					workers[l.GetValue()] = true
				}
			}
		}
	}
	if !workers[d2.ID()] {
		t.Errorf("pdserve_kv_blocks_capacity labelled by worker: %v, want %s", workers, d2.ID())
	}
}

func TestHeartbeatsAndDrainCommand(t *testing.T) {
	url := startNATS(t)
	o := testOptions(control.RoleDecode, url)
	o.ID = "decode-hb"
	w := startWorker(t, o)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	beats := make(chan control.Heartbeat, 64)
	sub, err := nc.Subscribe(control.HeartbeatSubject(string(control.RoleDecode), "decode-hb"), func(m *nats.Msg) {
		var hb control.Heartbeat
		if json.Unmarshal(m.Data, &hb) == nil {
			select {
			case beats <- hb:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	next := func(draining bool) control.Heartbeat {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case hb := <-beats:
				if hb.Draining == draining {
					return hb
				}
			case <-timeout:
				t.Fatalf("no heartbeat with draining=%v", draining)
			}
		}
	}
	hb := next(false)
	want := control.Heartbeat{ID: "decode-hb", Role: "decode", GRPCAddr: w.Addr(), Model: "tiny", KVBlocksFree: 64, KVBlocksTotal: 64}
	got := control.Heartbeat{ID: hb.ID, Role: hb.Role, GRPCAddr: hb.GRPCAddr, Model: hb.Model, KVBlocksFree: hb.KVBlocksFree, KVBlocksTotal: hb.KVBlocksTotal}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("heartbeat (-want +got):\n%s", diff)
	}
	metrics := httpGet(t, "http://"+w.MetricsAddr()+"/metrics")
	for _, name := range []string{"pdserve_kv_blocks_free 64", "pdserve_kv_blocks_capacity 64", "pdserve_decode_step_seconds_bucket", "go_goroutines"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}

	ctx := testCtx(t)
	if err := control.SendCommand(ctx, nc, "decode", "decode-hb", control.Command{Kind: control.CmdDrain}); err != nil {
		t.Fatal(err)
	}
	next(true)
	if !w.Draining() {
		t.Error("worker not draining after the drain command")
	}
	dc := pdservev1.NewDecodeServiceClient(dial(t, w))
	if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "late", Tokens: 10}); status.Code(err) != codes.Unavailable {
		t.Errorf("reserve on a draining worker: %v, want UNAVAILABLE", err)
	}
	resp, err := http.Get("http://" + w.MetricsAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz while draining: %d, want 503", resp.StatusCode)
	}
	if err := control.SendCommand(ctx, nc, "decode", "decode-hb", control.Command{Kind: "reboot"}); err == nil {
		t.Error("unknown command accepted")
	}
	if err := control.SendCommand(ctx, nc, "decode", "decode-hb", control.Command{Kind: control.CmdResend, RequestID: "a", Arg: "b:1"}); err == nil {
		t.Error("resend accepted by a decode worker")
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// TestGracefulStopFinishesInFlight stops a worker while a request runs: the
// request completes, new ones are refused, and Stop returns cleanly.
func TestGracefulStopFinishesInFlight(t *testing.T) {
	o := testOptions(control.RoleColocated, "")
	gated := newGated(newEngine(t), 2, -1)
	o.EngineOverride = gated
	w, err := Start(testCtx(t), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	dc := pdservev1.NewDecodeServiceClient(dial(t, w))
	ctx := testCtx(t)
	gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: "inflight", PromptTokens: prompt(9, 1), MaxTokens: 8, IgnoreEos: true, LocalPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readGenerate(gen, 3); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	poll.WaitFor(t, "draining", w.Draining)
	if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "new", Tokens: 10}); status.Code(err) != codes.Unavailable {
		t.Errorf("reserve during stop: %v, want UNAVAILABLE", err)
	}
	gated.open()
	rest, err := readGenerate(gen, 0)
	if err != nil || rest.reason != decode.FinishLength {
		t.Errorf("in-flight request during stop: reason %q, %v; want it to finish", rest.reason, err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("stop: %v", err)
	}
	select {
	case <-w.Done():
	default:
		t.Error("Done not closed after Stop")
	}
}
