package tracing

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/pkg/budget"
)

// ScopeName is the instrumentation scope of pdserve's spans.
const ScopeName = "github.com/pdserve/pdserve"

// Span names. The coordinator's request span and its phases are built
// from the request's budget.Trace, so that each phase lasts exactly its
// budget term; see the package doc.
const (
	SpanRequest    = "pdserve.request" // Arrival → LastToken: e2e
	SpanQueue      = "queue"           // Arrival → PrefillStart: the budget's queue
	SpanRoute      = "route"           // one router decision, child of queue
	SpanPrefill    = "prefill"         // PrefillStart → PrefillEnd
	SpanKVTransfer = "kv_transfer"     // PrefillEnd → KVDone
	SpanFirstToken = "first_token"     // end of the phase before it → FirstToken
	SpanDecode     = "decode"          // FirstToken → LastToken

	// Worker steps, children of the worker's server span of the call.
	SpanPrefillCompute = "prefill.compute" // the worker's prefill of the prompt
	SpanKVPush         = "kv.push"         // prefill worker: first KV byte sent → decode worker's ack
	SpanKVReceive      = "kv.receive"      // decode worker: first KV byte → KV complete
	SpanDecodeWait     = "decode.wait"     // decode worker: call start → the sequence joined the batch
	SpanDecodeGenerate = "decode.generate" // decode worker: joined → last token
)

// Attribute keys of the request span (and, for the KV ones, kv_transfer).
const (
	AttrRequestID       = attribute.Key("pdserve.request_id")
	AttrModel           = attribute.Key("gen_ai.request.model")
	AttrInputTokens     = attribute.Key("gen_ai.usage.input_tokens")
	AttrOutputTokens    = attribute.Key("gen_ai.usage.output_tokens")
	AttrMode            = attribute.Key("pdserve.mode")
	AttrPolicy          = attribute.Key("pdserve.first_token_policy")
	AttrCodec           = attribute.Key("pdserve.codec")
	AttrPrefillWorker   = attribute.Key("pdserve.prefill_worker")
	AttrDecodeWorker    = attribute.Key("pdserve.decode_worker")
	AttrPrefixHit       = attribute.Key("pdserve.prefix_hit_tokens")
	AttrDecodePrefixHit = attribute.Key("pdserve.decode_prefix_hit_tokens")
	AttrKVBytesRaw      = attribute.Key("pdserve.kv_bytes_raw")
	AttrKVBytesWire     = attribute.Key("pdserve.kv_bytes_wire")
	AttrBatchSize       = attribute.Key("pdserve.batch_size")
	AttrRecoveries      = attribute.Key("pdserve.recoveries")
	AttrStatus          = attribute.Key("pdserve.status")
	AttrFinishReason    = attribute.Key("pdserve.finish_reason")
	AttrCache           = attribute.Key("pdserve.cache")
	// AttrInTTFT on kv_transfer: whether the transfer ended before the
	// first token reached the client, so that it lies on TTFT's path
	// (always under first-token policy decode); false when it ran beside
	// decode (policy prefill, the first token sent before the KV was
	// acknowledged: the transfer is in the first inter-token gap).
	AttrInTTFT = attribute.Key("pdserve.kv_transfer_in_ttft")
)

// tracer returns pdserve's tracer of the provider of ctx's span and
// whether that span records: a span that does not record (tracing off,
// not sampled) gets no children.
func tracer(ctx context.Context) (trace.Tracer, bool) {
	s := trace.SpanFromContext(ctx)
	if !s.IsRecording() {
		return nil, false
	}
	return s.TracerProvider().Tracer(ScopeName), true
}

// Recording reports whether ctx's span records: whether a worker's call
// is traced.
func Recording(ctx context.Context) bool { return trace.SpanFromContext(ctx).IsRecording() }

// StartHTTP starts the server span of an HTTP request at arrival,
// continuing the trace of its W3C traceparent (and tracestate) header
// when it has one; name is "METHOD route". With tp nil it returns r's
// context and a span that records nothing.
func StartHTTP(tp trace.TracerProvider, r *http.Request, route string, arrival time.Time) (context.Context, trace.Span) {
	ctx := r.Context()
	if tp == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
	return tp.Tracer(ScopeName).Start(ctx, r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(arrival), trace.WithAttributes(
			attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path),
			attribute.String("http.route", route)))
}

// TraceResponse returns the W3C traceresponse header value of span
// ("00-trace id-span id-flags"), "" when it records nothing.
func TraceResponse(span trace.Span) string {
	sc := span.SpanContext()
	if !span.IsRecording() || !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// EndHTTP ends an HTTP server span with the response's status code: an
// error for 5xx, as OpenTelemetry's HTTP conventions say.
func EndHTTP(span trace.Span, status int) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// StartRequest starts the request span of tr under ctx's span, at
// tr.Arrival; with tp nil, a span that records nothing. End it with
// EndRequest.
func StartRequest(ctx context.Context, tp trace.TracerProvider, tr *budget.Trace) (context.Context, trace.Span) {
	if tp == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return tp.Tracer(ScopeName).Start(ctx, SpanRequest, trace.WithTimestamp(tr.Arrival),
		trace.WithAttributes(AttrRequestID.String(tr.RequestID)))
}

// EndRequest sets the budget's facts on the request span and ends it at
// tr.LastToken (its e2e), or at now when no token was delivered. Status
// error and unavailable mark the span as failed.
func EndRequest(span trace.Span, tr *budget.Trace, now time.Time) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(
		AttrModel.String(tr.Model), AttrInputTokens.Int(tr.PromptTokens), AttrOutputTokens.Int(tr.OutputTokens),
		AttrMode.String(tr.Mode), AttrPolicy.String(tr.FirstTokenPolicy), AttrCodec.String(tr.Codec),
		AttrPrefillWorker.String(tr.PrefillWorker), AttrDecodeWorker.String(tr.DecodeWorker),
		AttrPrefixHit.Int(tr.PrefixHitTokens), AttrDecodePrefixHit.Int(tr.DecodePrefixHitTokens),
		AttrKVBytesRaw.Int64(tr.KVBytesRaw), AttrKVBytesWire.Int64(tr.KVBytesWire),
		AttrBatchSize.Int(tr.BatchSize), AttrRecoveries.Int(tr.Recoveries),
		AttrStatus.String(tr.Status), AttrFinishReason.String(tr.FinishReason),
	)
	if tr.Cache != "" {
		span.SetAttributes(AttrCache.String(tr.Cache))
	}
	switch tr.Status {
	case budget.StatusError, budget.StatusUnavailable:
		span.SetStatus(codes.Error, tr.Status)
	}
	end := now
	if !tr.LastToken.IsZero() && !tr.LastToken.Before(tr.Arrival) {
		end = tr.LastToken
	}
	span.End(trace.WithTimestamp(end))
}

// StartQueue starts the queue phase of tr under ctx's (request) span at
// tr.Arrival; routing and the decode worker's Reserve run under the
// context it returns. The span records nothing when ctx's does not.
func StartQueue(ctx context.Context, tr *budget.Trace) (context.Context, trace.Span) {
	t, ok := tracer(ctx)
	if !ok {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.Start(ctx, SpanQueue, trace.WithTimestamp(tr.Arrival))
}

// Route records one router decision that took start → end, under ctx's
// span.
func Route(ctx context.Context, start, end time.Time, err error) {
	t, ok := tracer(ctx)
	if !ok {
		return
	}
	_, s := t.Start(ctx, SpanRoute, trace.WithTimestamp(start))
	if err != nil {
		s.SetStatus(codes.Error, "no worker")
	}
	s.End(trace.WithTimestamp(end))
}

// EndPhases ends the queue span at tr.PrefillStart (now when the prefill
// never started) and records the phases after it under ctx's (request)
// span, each from the budget's boundaries, so that each lasts its term:
// prefill, kv_transfer, first_token (from the end of prefill, or of the
// KV transfer when the first token waits for it, to the first token) and
// decode. A phase whose boundaries are not both set is left out (its term
// is 0); one whose end comes before its start lasts 0, as its term. The critical path queue + prefill + [kv_transfer] + first_token
// + decode is the request's e2e (and the part before decode its ttft);
// kv_transfer is on it when it ended before the first token (attribute
// pdserve.kv_transfer_in_ttft), else it runs beside decode.
func EndPhases(ctx context.Context, queue trace.Span, tr *budget.Trace, now time.Time) {
	t, ok := tracer(ctx)
	if !ok {
		return
	}
	if ps := tr.PrefillStart; !ps.IsZero() && !ps.Before(tr.Arrival) {
		queue.End(trace.WithTimestamp(ps))
	} else {
		queue.End(trace.WithTimestamp(now))
	}
	phase := func(name string, a, b time.Time, attrs ...attribute.KeyValue) {
		if a.IsZero() || b.IsZero() {
			return
		}
		if b.Before(a) {
			b = a // clamped to 0, as the budget's term (e.g. KV done before the prefill's end)
		}
		_, s := t.Start(ctx, name, trace.WithTimestamp(a), trace.WithAttributes(attrs...))
		s.End(trace.WithTimestamp(b))
	}
	phase(SpanPrefill, tr.PrefillStart, tr.PrefillEnd, AttrPrefillWorker.String(tr.PrefillWorker), AttrPrefixHit.Int(tr.PrefixHitTokens))
	inTTFT := !tr.KVDone.IsZero() && !tr.FirstToken.Before(tr.KVDone)
	phase(SpanKVTransfer, tr.PrefillEnd, tr.KVDone, AttrCodec.String(tr.Codec), AttrKVBytesRaw.Int64(tr.KVBytesRaw),
		AttrKVBytesWire.Int64(tr.KVBytesWire), AttrInTTFT.Bool(inTTFT))
	first := tr.PrefillEnd
	if inTTFT && tr.KVDone.After(first) {
		first = tr.KVDone
	}
	phase(SpanFirstToken, first, tr.FirstToken)
	phase(SpanDecode, tr.FirstToken, tr.LastToken, AttrDecodeWorker.String(tr.DecodeWorker), AttrBatchSize.Int(tr.BatchSize))
}

// Step records a worker's step that ran from startNs to endNs (Unix
// nanoseconds, the stamps the worker reports) as a child of ctx's span
// (the worker's server span of the call) when that span records; nothing
// when a stamp is 0 or end is before start.
func Step(ctx context.Context, name string, startNs, endNs int64, attrs ...attribute.KeyValue) {
	if startNs == 0 || endNs == 0 || endNs < startNs {
		return
	}
	t, ok := tracer(ctx)
	if !ok {
		return
	}
	_, s := t.Start(ctx, name, trace.WithTimestamp(time.Unix(0, startNs)), trace.WithAttributes(attrs...))
	s.End(trace.WithTimestamp(time.Unix(0, endNs)))
}

// KVAttrs are the attributes of a KV transfer step.
func KVAttrs(codec string, raw, wire int64) []attribute.KeyValue {
	return []attribute.KeyValue{AttrCodec.String(codec), AttrKVBytesRaw.Int64(raw), AttrKVBytesWire.Int64(wire)}
}

// TraceID returns the trace id of ctx's span, "" when it records nothing
// (for the request log line).
func TraceID(ctx context.Context) string {
	s := trace.SpanFromContext(ctx)
	if !s.IsRecording() {
		return ""
	}
	return s.SpanContext().TraceID().String()
}
