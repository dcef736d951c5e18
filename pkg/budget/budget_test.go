package budget

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestTerms(t *testing.T) {
	tests := []struct {
		name  string
		trace Trace
		want  Terms
	}{
		{
			name: "disaggregated, first token from prefill",
			trace: Trace{
				Arrival: at(0), Routed: at(1), PrefillQueued: at(2), PrefillStart: at(5), PrefillEnd: at(25),
				KVFirstByte: at(8), KVDone: at(30), DecodeJoined: at(31), FirstToken: at(26), LastToken: at(66),
				OutputTokens: 5,
			},
			want: Terms{
				TTFT: 26 * time.Millisecond, E2E: 66 * time.Millisecond, TPOT: 10 * time.Millisecond,
				Queue: 5 * time.Millisecond, Prefill: 20 * time.Millisecond,
				KVTransfer: 5 * time.Millisecond, KVStream: 22 * time.Millisecond, Decode: 40 * time.Millisecond,
			},
		},
		{
			name:  "one output token has no tpot",
			trace: Trace{Arrival: at(0), FirstToken: at(10), LastToken: at(10), OutputTokens: 1},
			want:  Terms{TTFT: 10 * time.Millisecond, E2E: 10 * time.Millisecond},
		},
		{
			name:  "with tokens, e2e ends at the last token, not at the response's end",
			trace: Trace{Arrival: at(0), FirstToken: at(10), LastToken: at(10), Ended: at(12), OutputTokens: 1},
			want:  Terms{TTFT: 10 * time.Millisecond, E2E: 10 * time.Millisecond},
		},
		{
			name:  "a reply of no token: e2e to its end, no ttft",
			trace: Trace{Arrival: at(0), PrefillStart: at(2), PrefillEnd: at(30), Ended: at(40)},
			want:  Terms{E2E: 40 * time.Millisecond, Queue: 2 * time.Millisecond, Prefill: 28 * time.Millisecond},
		},
		{
			name:  "missing boundaries give zero terms",
			trace: Trace{Arrival: at(0)},
			want:  Terms{},
		},
		{
			name:  "clock skew clamps to zero",
			trace: Trace{Arrival: at(10), PrefillStart: at(5), PrefillEnd: at(20), KVDone: at(19), FirstToken: at(30), LastToken: at(30), OutputTokens: 1},
			want:  Terms{TTFT: 20 * time.Millisecond, E2E: 20 * time.Millisecond, Prefill: 15 * time.Millisecond},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.trace.Terms()); diff != "" {
				t.Errorf("Terms (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTokens(t *testing.T) {
	var tr Trace
	tr.Tokens(at(10), 0) // no tokens: no boundary
	tr.Tokens(at(20), 1)
	tr.Tokens(at(25), 2)
	tr.Tokens(at(40), 1)
	want := Trace{FirstToken: at(20), LastToken: at(40), OutputTokens: 4, ITLs: []time.Duration{5 * time.Millisecond, 15 * time.Millisecond}}
	if diff := cmp.Diff(want, tr); diff != "" {
		t.Errorf("trace after Tokens (-want +got):\n%s", diff)
	}
}

func TestSummary(t *testing.T) {
	tr := Trace{
		RequestID: "r1", Model: "tiny", Mode: "disaggregated", FirstTokenPolicy: "prefill",
		Arrival: at(0), PrefillStart: at(1), PrefillEnd: at(3), KVDone: at(4),
		FirstToken: at(3), LastToken: at(9), OutputTokens: 3, PromptTokens: 7, BatchSize: 2, PrefixHitTokens: 4,
		KVBytesRaw: 1000, KVBytesWire: 600, Codec: "zstd", PrefillWorker: "p0", DecodeWorker: "d0", Recoveries: 1,
	}
	want := Summary{
		TTFTMs: 3, TPOTMs: 3, QueueMs: 1, PrefillMs: 2, KVTransferMs: 1, DecodeMs: 6, E2EMs: 9,
		PromptTokens: 7, OutputTokens: 3, PrefixHitTokens: 4, BatchSize: 2,
		KVBytesRaw: 1000, KVBytesWire: 600, Codec: "zstd", PrefillWorker: "p0", DecodeWorker: "d0",
		Mode: "disaggregated", FirstTokenPolicy: "prefill", Recoveries: 1,
	}
	if diff := cmp.Diff(want, tr.Summary()); diff != "" {
		t.Errorf("Summary (-want +got):\n%s", diff)
	}
}

func TestLogIsOneLineWithBudget(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	tr := Trace{RequestID: "r1", Status: StatusOK, Arrival: at(0), FirstToken: at(5), LastToken: at(5), OutputTokens: 1, Codec: "none"}
	tr.Log(zap.New(core))
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("got %d log entries, want 1", len(entries))
	}
	m := entries[0].ContextMap()
	for key, want := range map[string]any{
		"request_id": "r1", "status": "ok", "codec": "none", "ttft": 5 * time.Millisecond,
		"t_arrival": at(0), "output_tokens": int64(1),
	} {
		if diff := cmp.Diff(want, m[key]); diff != "" {
			t.Errorf("field %s (-want +got):\n%s", key, diff)
		}
	}
	if _, ok := m["t_kv_done"]; ok {
		t.Errorf("unset boundary t_kv_done logged")
	}
}

// summaryAndLog returns field key of tr's JSON summary and of its log
// line, each with whether it is there.
func summaryAndLog(t *testing.T, tr *Trace, key string) (inSummary any, okSummary bool, inLog any, okLog bool) {
	t.Helper()
	b, err := json.Marshal(tr.Summary())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	tr.Log(zap.New(core))
	inSummary, okSummary = m[key]
	inLog, okLog = logs.All()[0].ContextMap()[key]
	return inSummary, okSummary, inLog, okLog
}

// TestCodecReasonField: why the prefill worker chose its codec is in the
// summary and the log line when it chose, and absent when it did not.
func TestCodecReasonField(t *testing.T) {
	for _, reason := range []string{"", "bf16 1.46x: 4 ms, link-bound"} {
		t.Run("reason="+reason, func(t *testing.T) {
			tr := Trace{RequestID: "r1", Status: StatusOK, Codec: "bf16", CodecReason: reason}
			got, inJSON, logged, inLog := summaryAndLog(t, &tr, "codec_reason")
			if reason == "" {
				if inJSON || inLog {
					t.Errorf("codec_reason in the summary (%v) or the log (%v) of a named codec", got, logged)
				}
				return
			}
			if got != reason || logged != reason {
				t.Errorf("summary codec_reason %v, log %v; want %q", got, logged, reason)
			}
		})
	}
}

// TestCacheField: the response cache's answer is in the summary and the
// log line when there is one, and absent from both when there is none.
func TestCacheField(t *testing.T) {
	for _, cache := range []string{"", CacheHit, CacheMiss} {
		t.Run("cache="+cache, func(t *testing.T) {
			tr := Trace{RequestID: "r1", Status: StatusOK, Cache: cache}
			got, inJSON, logged, inLog := summaryAndLog(t, &tr, "cache")
			if cache == "" {
				if inJSON || inLog {
					t.Errorf("cache in the summary (%v) or the log (%v) of a request not looked up", got, logged)
				}
				return
			}
			if got != cache || logged != cache {
				t.Errorf("summary cache %v, log cache %v; want %q", got, logged, cache)
			}
		})
	}
}

// TestTTFO: the first Output sets FirstOutput; ttfo is measured from
// arrival, after ttft when reasoning came first, absent without output.
func TestTTFO(t *testing.T) {
	t0 := time.Unix(100, 0)
	tr := &Trace{Arrival: t0}
	tr.Tokens(t0.Add(40*time.Millisecond), 1) // reasoning
	if got := tr.Terms().TTFO; got != 0 {
		t.Errorf("TTFO %v before any answer, want 0", got)
	}
	tr.Tokens(t0.Add(90*time.Millisecond), 1)
	tr.Output(t0.Add(90 * time.Millisecond))
	tr.Output(t0.Add(120 * time.Millisecond))
	s := tr.Summary()
	if s.TTFTMs != 40 || s.TTFOMs != 90 {
		t.Errorf("ttft %v ttfo %v, want 40 and 90", s.TTFTMs, s.TTFOMs)
	}
}

// TestBudgetLeft: the TTFT budget left for the terms ahead is the budget
// less the client's network term and the time since arrival; none
// without a budget; spent (≤ 0) once they reach it; the client's RTT is
// in the split (Terms, the summary's client_rtt_ms, the log line).
func TestBudgetLeft(t *testing.T) {
	for _, tc := range []struct {
		name      string
		budget    time.Duration
		clientRTT time.Duration
		now       time.Time
		want      time.Duration
		ok        bool
	}{
		{name: "no budget", clientRTT: 30 * time.Millisecond, now: at(10)},
		{name: "at arrival, no RTT measured", budget: 300 * time.Millisecond, now: at(0), want: 300 * time.Millisecond, ok: true},
		{name: "client RTT and time spent", budget: 300 * time.Millisecond, clientRTT: 40 * time.Millisecond, now: at(25), want: 235 * time.Millisecond, ok: true},
		{name: "a clock before arrival spends nothing", budget: 300 * time.Millisecond, clientRTT: 40 * time.Millisecond, now: at(-5), want: 260 * time.Millisecond, ok: true},
		{name: "spent exactly", budget: 100 * time.Millisecond, clientRTT: 60 * time.Millisecond, now: at(40), want: 0, ok: true},
		{name: "overspent", budget: 100 * time.Millisecond, clientRTT: 90 * time.Millisecond, now: at(30), want: -20 * time.Millisecond, ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := Trace{Arrival: at(0), ClientRTT: tc.clientRTT, Objective: Objective{TTFTBudget: tc.budget}}
			got, ok := tr.BudgetLeft(tc.now)
			if got != tc.want || ok != tc.ok {
				t.Errorf("BudgetLeft = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}

	tr := Trace{Arrival: at(0), FirstToken: at(50), LastToken: at(50), OutputTokens: 1, ClientRTT: 12500 * time.Microsecond}
	if got := tr.Terms().ClientRTT; got != 12500*time.Microsecond {
		t.Errorf("Terms().ClientRTT = %v, want 12.5ms", got)
	}
	b, err := json.Marshal(tr.Summary())
	if err != nil {
		t.Fatal(err)
	}
	var sum map[string]any
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	if sum["client_rtt_ms"] != 12.5 {
		t.Errorf("summary client_rtt_ms = %v, want 12.5", sum["client_rtt_ms"])
	}
	var logged bool
	for _, f := range tr.Fields() {
		if f.Key == "client_rtt" && time.Duration(f.Integer) == 12500*time.Microsecond {
			logged = true
		}
	}
	if !logged {
		t.Error("the log line has no client_rtt of 12.5ms")
	}
	tr.ClientRTT = 0
	sum = nil
	if b, _ := json.Marshal(tr.Summary()); json.Unmarshal(b, &sum) == nil && sum["client_rtt_ms"] != nil {
		t.Errorf("summary client_rtt_ms = %v without a measure, want absent", sum["client_rtt_ms"])
	}
}
