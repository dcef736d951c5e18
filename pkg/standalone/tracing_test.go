package standalone_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap/zaptest"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/standalone"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/tracing/tracingtest"
	"github.com/pdserve/pdserve/pkg/workerrun"
)

// noEnv is an empty environment: the tests do not see the OTEL_*
// variables of the machine.
func noEnv(string) string { return "" }

// startTraced starts a standalone deployment (one prefill, one decode
// worker, the tiny ref model) whose traces go to rcv over gRPC, or
// untraced when rcv is nil. With ownExporters each worker exports
// through a provider of its own, as a worker binary does (its own
// service.name), instead of the coordinator's.
func startTraced(t *testing.T, rcv *tracingtest.Receiver, policy string, ownExporters bool) *standalone.Server {
	t.Helper()
	o := coordinator.DefaultOptions()
	o.HTTPAddr, o.Standalone, o.FirstTokenPolicy = "127.0.0.1:0", true, policy
	o.Tracing.Getenv = noEnv
	if rcv != nil {
		o.Tracing.Endpoint, o.Tracing.Protocol = rcv.GRPCEndpoint(), tracing.ProtocolGRPC
	}
	workerOpts := func(wo *workerrun.Options) {
		wo.HeartbeatInterval = 20 * time.Millisecond
		if ownExporters {
			wo.TracerProvider = nil
			wo.Tracing.Getenv, wo.Tracing.Endpoint, wo.Tracing.Protocol = noEnv, rcv.GRPCEndpoint(), tracing.ProtocolGRPC
		}
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	s, err := standalone.Start(context.Background(), o, zaptest.NewLogger(t), standalone.WithWorkerOptions(workerOpts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	poll.CheckFor(t, 10*time.Second, 10*time.Millisecond, s.Ready)
	return s
}

// tracedCompletion sends a completion with header traceparent (none
// when empty) and returns the response's traceresponse header and its
// budget.
func tracedCompletion(t *testing.T, addr, traceparent string) (string, budget.Summary) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": strings.Repeat("trace me ", 20), "max_tokens": 6, "ignore_eos": true})
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var out struct {
		PDServe budget.Summary `json:"pdserve"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, %v", resp.StatusCode, err)
	}
	return resp.Header.Get("traceresponse"), out.PDServe
}

func durMs(s *tracepb.Span) float64 {
	return float64(s.GetEndTimeUnixNano()-s.GetStartTimeUnixNano()) / 1e6
}

// TestTracesFollowBudget is issue 28's acceptance: a completion with a
// W3C traceparent through a standalone deployment (coordinator, prefill
// and decode worker over gRPC on loopback) exports, to an in-process OTLP
// receiver, spans that all continue the client's trace, in the tree
// HTTP server span → pdserve.request → queue (route, Reserve), prefill,
// kv_transfer, first_token, decode and the gRPC calls, whose worker-side
// server spans hold the workers' steps; the request span has the model,
// tokens, codec and workers; each phase lasts its term of the response's
// budget within a millisecond, and the phases on the critical path add
// up to the request span (e2e). Under both first-token policies, and
// with the workers exporting through providers of their own, as the
// binaries do (their spans then carry their own service.name).
func TestTracesFollowBudget(t *testing.T) {
	for _, tc := range []struct {
		policy string
		// own: the workers export on their own, as separate binaries
		// do; the trace still joins over gRPC metadata.
		own bool
	}{{coordinator.PolicyPrefill, false}, {coordinator.PolicyDecode, false}, {coordinator.PolicyDecode, true}} {
		policy := tc.policy
		name := policy
		if tc.own {
			name += "/own-exporters"
		}
		t.Run(name, func(t *testing.T) {
			rcv := tracingtest.Start(t)
			s := startTraced(t, rcv, policy, tc.own)
			const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
			traceresp, sum := tracedCompletion(t, s.HTTPAddr(), "00-"+traceID+"-"+parentID+"-01")
			if !strings.HasPrefix(traceresp, "00-"+traceID+"-") {
				t.Errorf("traceresponse %q does not continue trace %s", traceresp, traceID)
			}
			if sum.Mode != coordinator.ModeDisaggregated || sum.FirstTokenPolicy != policy || sum.OutputTokens != 6 {
				t.Fatalf("budget: mode %q policy %q output %d, want a disaggregated request of 6 tokens under %s", sum.Mode, sum.FirstTokenPolicy, sum.OutputTokens, policy)
			}
			// A traceparent that is not sampled is followed: no span, no
			// traceresponse.
			const unsampled = "0af7651916cd43dd8448eb211c80319c"
			if tr, _ := tracedCompletion(t, s.HTTPAddr(), "00-"+unsampled+"-b7ad6b7169203331-00"); tr != "" {
				t.Errorf("traceresponse %q for a traceparent not sampled", tr)
			}
			// Shutdown flushes the exporter.
			if err := s.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}

			spans := rcv.Spans()
			byName := map[string][]*tracepb.Span{}
			byID := map[string]*tracepb.Span{}
			for _, sp := range spans {
				if got := hex.EncodeToString(sp.GetTraceId()); got == unsampled {
					t.Errorf("span %s of the trace not sampled", sp.GetName())
					continue
				} else if got != traceID {
					t.Errorf("span %s has trace id %s, want the client's %s", sp.GetName(), got, traceID)
				}
				byName[sp.GetName()] = append(byName[sp.GetName()], sp.Span)
				byID[string(sp.GetSpanId())] = sp.Span
			}
			one := func(name string) *tracepb.Span {
				t.Helper()
				if n := len(byName[name]); n != 1 {
					t.Fatalf("%d spans %q, want 1; spans: %v", n, name, names(spans))
				}
				return byName[name][0]
			}
			parentIs := func(child, parent *tracepb.Span) {
				t.Helper()
				if !bytes.Equal(child.GetParentSpanId(), parent.GetSpanId()) {
					p := byID[string(child.GetParentSpanId())]
					t.Errorf("span %s: parent %s, want %s", child.GetName(), p.GetName(), parent.GetName())
				}
			}

			root := one("POST /v1/completions")
			if got := hex.EncodeToString(root.GetParentSpanId()); got != parentID || root.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("HTTP span: parent %s kind %v, want the client's span %s, server", got, root.GetKind(), parentID)
			}
			if traceresp != "00-"+traceID+"-"+hex.EncodeToString(root.GetSpanId())+"-01" {
				t.Errorf("traceresponse %q does not name the HTTP span", traceresp)
			}
			req := one(tracing.SpanRequest)
			parentIs(req, root)
			queue := one(tracing.SpanQueue)
			phases := map[string]*tracepb.Span{tracing.SpanQueue: queue}
			for _, name := range []string{tracing.SpanPrefill, tracing.SpanKVTransfer, tracing.SpanFirstToken, tracing.SpanDecode} {
				phases[name] = one(name)
			}
			for _, p := range phases {
				parentIs(p, req)
			}
			parentIs(one(tracing.SpanRoute), queue)
			client := func(method string) *tracepb.Span {
				t.Helper()
				for _, sp := range byName[method] {
					if sp.GetKind() == tracepb.Span_SPAN_KIND_CLIENT {
						return sp
					}
				}
				t.Fatalf("no client span %s", method)
				return nil
			}
			parentIs(client("pdserve.v1.DecodeService/Reserve"), queue)

			// gRPC: the coordinator's client spans, the workers' server
			// spans under them, the workers' steps under those.
			for _, rpc := range []struct {
				method string
				steps  []string
			}{
				{"pdserve.v1.PrefillService/Prefill", []string{tracing.SpanPrefillCompute, tracing.SpanKVPush}},
				{"pdserve.v1.DecodeService/Generate", []string{tracing.SpanKVReceive, tracing.SpanDecodeWait, tracing.SpanDecodeGenerate}},
			} {
				var client, server *tracepb.Span
				for _, sp := range byName[rpc.method] {
					switch sp.GetKind() {
					case tracepb.Span_SPAN_KIND_CLIENT:
						client = sp
					case tracepb.Span_SPAN_KIND_SERVER:
						server = sp
					}
				}
				if client == nil || server == nil {
					t.Fatalf("%s: client span %v, server span %v; want both", rpc.method, client != nil, server != nil)
				}
				parentIs(client, req)
				parentIs(server, client)
				for _, step := range rpc.steps {
					parentIs(one(step), server)
				}
				wantService := "pdserve-coordinator"
				if tc.own {
					wantService = map[string]string{"pdserve.v1.PrefillService/Prefill": "pdserve-prefill-worker",
						"pdserve.v1.DecodeService/Generate": "pdserve-decode-worker"}[rpc.method]
				}
				for _, sp := range spans {
					if bytes.Equal(sp.GetSpanId(), server.GetSpanId()) && sp.Service != wantService {
						t.Errorf("%s server span of service %q, want %q", rpc.method, sp.Service, wantService)
					}
				}
			}

			// Attributes of the request span.
			want := map[string]any{
				"gen_ai.request.model":       "tiny",
				"gen_ai.usage.input_tokens":  int64(sum.PromptTokens),
				"gen_ai.usage.output_tokens": int64(sum.OutputTokens),
				"pdserve.codec":              sum.Codec,
				"pdserve.prefill_worker":     "prefill-0",
				"pdserve.decode_worker":      "decode-0",
				"pdserve.prefix_hit_tokens":  int64(sum.PrefixHitTokens),
				"pdserve.first_token_policy": policy,
				"pdserve.status":             budget.StatusOK,
			}
			for k, v := range want {
				if got, ok := tracingtest.Attr(req, k); !ok || got != v {
					t.Errorf("request span %s = %v (%v), want %v", k, got, ok, v)
				}
			}
			if sum.Codec == "" {
				t.Error("budget names no codec")
			}

			// Durations: each phase its budget term, within 1 ms.
			near := func(what string, got, want float64) {
				t.Helper()
				if math.Abs(got-want) > 1 {
					t.Errorf("%s: %.3f ms, want %.3f ms (the budget's) within 1 ms", what, got, want)
				}
			}
			near("request span vs e2e_ms", durMs(req), sum.E2EMs)
			near("queue vs queue_ms", durMs(queue), sum.QueueMs)
			near("prefill vs prefill_ms", durMs(phases[tracing.SpanPrefill]), sum.PrefillMs)
			near("kv_transfer vs kv_transfer_ms", durMs(phases[tracing.SpanKVTransfer]), sum.KVTransferMs)
			near("decode vs decode_ms", durMs(phases[tracing.SpanDecode]), sum.DecodeMs)
			path := durMs(queue) + durMs(phases[tracing.SpanPrefill]) + durMs(phases[tracing.SpanFirstToken])
			inTTFT, _ := tracingtest.Attr(phases[tracing.SpanKVTransfer], "pdserve.kv_transfer_in_ttft")
			// Under policy decode the first token waits for the KV; under
			// policy prefill it does not, but the transfer of a small
			// prompt may still end first.
			if inTTFT == true {
				path += durMs(phases[tracing.SpanKVTransfer])
			} else if policy == coordinator.PolicyDecode {
				t.Errorf("kv_transfer in TTFT = %v under policy decode", inTTFT)
			}
			near("queue+prefill+[kv_transfer]+first_token vs ttft_ms", path, sum.TTFTMs)
			near("critical path vs the request span", path+durMs(phases[tracing.SpanDecode]), durMs(req))
			if d := durMs(root); d+1 < durMs(req) {
				t.Errorf("HTTP span %.3f ms is shorter than its request span %.3f ms", d, durMs(req))
			}
		})
	}
}

func names(spans []tracingtest.Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.GetName()
	}
	return out
}

// TestTracingOffByDefault: without an endpoint the response has no
// traceresponse and the deployment exports nothing, whatever the
// request's traceparent.
func TestTracingOffByDefault(t *testing.T) {
	s := startTraced(t, nil, coordinator.PolicyPrefill, false)
	traceresp, _ := tracedCompletion(t, s.HTTPAddr(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if traceresp != "" {
		t.Errorf("traceresponse %q with tracing off", traceresp)
	}
}
