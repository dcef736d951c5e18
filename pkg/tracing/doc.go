// Package tracing exports OpenTelemetry traces of pdserve's requests
// over OTLP (go.opentelemetry.io/otel): the coordinator's span of each
// request, with a child per term of its budget (pkg/budget), and the
// workers' spans of the gRPC calls it makes and of their steps, in one
// trace that continues the client's W3C traceparent.
//
// # Configuration
//
// Off by default: with no endpoint there is no SDK, no exporter, no
// gRPC stats handler and no span, and every function here returns at
// once (Provider.TracerProvider is nil). The flags of all three binaries
// win over the environment, which follows OpenTelemetry's variables:
//
//	--otel-endpoint      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as is), then OTEL_EXPORTER_OTLP_ENDPOINT
//	                     (http/protobuf appends v1/traces); an http:// or https:// URL; none: off
//	--otel-protocol      OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL:
//	                     grpc or http/protobuf (default, as the specification's)
//	--otel-sample-ratio  parentbased_traceidratio with that ratio; else OTEL_TRACES_SAMPLER and
//	                     OTEL_TRACES_SAMPLER_ARG (every sampler of the specification), default
//	                     parentbased_always_on: a traceparent's sampled flag is followed
//	OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn tracing off whatever else is set.
//	OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES  the resource (default service.name
//	                     pdserve-coordinator, pdserve-prefill-worker, pdserve-decode-worker)
//	OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE, …  read by the exporter
//
// A bad endpoint (not an http(s) URL with a host and a valid port), an
// unknown protocol (http/json included: the Go SDK does not export it),
// sampler, ratio or exporter is a start-up error naming the flag or
// variable. An unreachable receiver is not: the exporter connects lazily
// and drops what it cannot send, as the SDK does.
//
// # Spans
//
// On the coordinator (package frontend and coordinator):
//
//	POST /v1/completions        server span of the HTTP request (parent: the client's traceparent);
//	                            its context is returned in the traceresponse header
//	  pdserve.request           one per prompt: Arrival → LastToken, the budget's e2e
//	    queue                   Arrival → PrefillStart (budget queue)
//	      route                 each router decision
//	      pdserve.v1.DecodeService/Reserve   gRPC client span
//	    prefill                 PrefillStart → PrefillEnd (budget prefill)
//	    kv_transfer             PrefillEnd → KVDone (budget kv_transfer)
//	    first_token             end of prefill (or of kv_transfer when it ended first) → FirstToken
//	    decode                  FirstToken → LastToken (budget decode)
//	    pdserve.v1.PrefillService/Prefill, …/Resend, …/Release, DecodeService/Generate, …/Cancel
//	                            gRPC client spans
//
// The phases are built from the budget's own timestamps when the request
// ends (start and end given explicitly), so each lasts exactly its term,
// and queue + prefill + [kv_transfer] + first_token + decode is the
// request span. kv_transfer is on that path when it ended before the
// first token (attribute pdserve.kv_transfer_in_ttft: always under
// first-token policy decode); under policy prefill it usually runs
// beside decode. Worker timestamps come from the workers' clocks, as in
// the budget. The request span carries gen_ai.request.model,
// gen_ai.usage.input_tokens and output_tokens, pdserve.request_id, mode,
// first_token_policy, codec, prefill_worker, decode_worker,
// prefix_hit_tokens, decode_prefix_hit_tokens, kv_bytes_raw and _wire,
// batch_size, recoveries, status, finish_reason and cache; status error
// or unavailable mark it failed. The request log line has trace_id.
//
// The trace context crosses gRPC in the calls' metadata (traceparent)
// through otelgrpc's stats handlers, on PrefillService and DecodeService
// only (KV pushes between workers ride pooled streams and are traced as
// the steps below). On the workers, under their server span of a call:
//
//	prefill.compute  the prompt's prefill (prefill worker; decode worker for a local prefill)
//	kv.push          prefill worker: first KV byte → the decode worker's ack (Prefill, Resend)
//	kv.receive       decode worker: first KV byte → KV complete
//	decode.wait      decode worker: the call's start → the sequence joined the batch
//	decode.generate  decode worker: joined → last token
//
// Standalone mode shares one provider between the coordinator and its
// in-process workers.
package tracing
