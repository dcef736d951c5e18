package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// Provider is the tracer provider of one process: the OpenTelemetry SDK
// exporting OTLP, or nothing when tracing is off. Safe for concurrent use.
type Provider struct {
	sdk *sdktrace.TracerProvider // nil when off
	cfg Config
}

// New resolves o and, when tracing is on, builds the SDK's tracer
// provider with a batching OTLP exporter (grpc or http/protobuf) to the
// resolved URL and the resolved sampler. The exporter connects lazily:
// an unreachable receiver is no start-up error (spans are dropped while
// it is down, as the SDK does). The exporters read the other
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, compression,
// certificates) themselves; the resource has service.name (o.ServiceName
// unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise).
// Errors: Resolve's, and the exporter's or resource's construction,
// wrapped.
func New(ctx context.Context, o Options) (*Provider, error) {
	c, err := o.Resolve()
	if err != nil {
		return nil, err
	}
	p := &Provider{cfg: c}
	if !c.Enabled {
		return p, nil
	}
	var exp sdktrace.SpanExporter
	switch c.Protocol {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(c.URL))
	default:
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(c.URL))
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: otlp exporter to %s: %w", redact(c.URL), err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(o.ServiceName)))
	if err == nil {
		var env *resource.Resource
		if env, err = resource.New(ctx, resource.WithFromEnv()); err == nil {
			res, err = resource.Merge(res, env)
		}
	}
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	p.sdk = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithSampler(c.Sampler))
	return p, nil
}

// Config returns the resolved configuration.
func (p *Provider) Config() Config { return p.cfg }

// TracerProvider returns the SDK's provider, or nil when tracing is off:
// every function of this package takes nil as "off" and then costs
// nothing.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk
}

// Shutdown exports the spans still queued and stops the exporter; ctx
// bounds it. A Provider that is off returns nil at once.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// propagator carries W3C trace context (traceparent, tracestate) in
// HTTP headers and gRPC metadata.
var propagator = propagation.TraceContext{}

// Traced gRPC methods: the request flow between the coordinator and the
// workers. KV pushes between workers and health checks are not traced:
// their streams are pooled and carry no request's context.
func tracedMethod(info *stats.RPCTagInfo) bool {
	return strings.HasPrefix(info.FullMethodName, "/"+pdservev1.PrefillService_ServiceDesc.ServiceName+"/") ||
		strings.HasPrefix(info.FullMethodName, "/"+pdservev1.DecodeService_ServiceDesc.ServiceName+"/")
}

func grpcOptions(tp trace.TracerProvider) []otelgrpc.Option {
	return []otelgrpc.Option{otelgrpc.WithTracerProvider(tp), otelgrpc.WithMeterProvider(noop.NewMeterProvider()),
		otelgrpc.WithPropagators(propagator), otelgrpc.WithFilter(tracedMethod)}
}

// DialOptions returns the dial options of a connection to a worker: a
// client span per call of PrefillService and DecodeService, child of
// the call context's span, whose trace context goes to the worker in the
// call's metadata (traceparent). None when tp is nil.
func DialOptions(tp trace.TracerProvider) []grpc.DialOption {
	if tp == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(grpcOptions(tp)...))}
}

// ServerOptions returns a worker's gRPC server options: a server span per
// call of PrefillService and DecodeService, child of the caller's span
// when its metadata carries one; the handler's context holds the span
// (see Step). None when tp is nil.
func ServerOptions(tp trace.TracerProvider) []grpc.ServerOption {
	if tp == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(grpcOptions(tp)...))}
}
