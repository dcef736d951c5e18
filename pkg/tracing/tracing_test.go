package tracing_test

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pdserve/pdserve/internal/cliflags"
	"github.com/pdserve/pdserve/pkg/tracing"
	"github.com/pdserve/pdserve/pkg/tracing/tracingtest"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestResolve: flags win over the environment, the environment follows
// OpenTelemetry's variables, tracing is off without an endpoint, and a
// bad setting is an error naming it.
func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		env   map[string]string
		// want: enabled, URL, protocol, sampler name; or an error
		// holding wantErr.
		enabled  bool
		url      string
		protocol string
		sampler  string
		off      string
		wantErr  string
	}{
		{name: "default off", off: "no endpoint", protocol: "http/protobuf", sampler: "parentbased_always_on"},
		{name: "flag grpc", flags: []string{"--otel-endpoint=http://127.0.0.1:4317", "--otel-protocol=grpc"},
			enabled: true, url: "http://127.0.0.1:4317", protocol: "grpc", sampler: "parentbased_always_on"},
		{name: "http base gets v1/traces", flags: []string{"--otel-endpoint=https://collector:4318/otlp/"},
			enabled: true, url: "https://collector:4318/otlp/v1/traces", protocol: "http/protobuf", sampler: "parentbased_always_on"},
		{name: "env base endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			enabled: true, url: "http://collector:4318/v1/traces", protocol: "http/protobuf", sampler: "parentbased_always_on"},
		{name: "env signal endpoint as is", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/custom"},
			enabled: true, url: "http://b:4318/custom", protocol: "http/protobuf", sampler: "parentbased_always_on"},
		{name: "env protocol, traces protocol first", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
			enabled: true, url: "http://a:4317", protocol: "grpc", sampler: "parentbased_always_on"},
		{name: "flags win", flags: []string{"--otel-endpoint=http://flag:4317", "--otel-protocol=grpc", "--otel-sample-ratio=0.25"},
			env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
				"OTEL_TRACES_SAMPLER": "always_off"},
			enabled: true, url: "http://flag:4317", protocol: "grpc", sampler: "parentbased_traceidratio=0.25"},
		{name: "env sampler", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
			"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
			enabled: true, url: "http://a:4318/v1/traces", protocol: "http/protobuf", sampler: "traceidratio=0.5"},
		{name: "sdk disabled", flags: []string{"--otel-endpoint=http://a:4317"}, env: map[string]string{"OTEL_SDK_DISABLED": "true"},
			url: "http://a:4317/v1/traces", protocol: "http/protobuf", sampler: "parentbased_always_on", off: "OTEL_SDK_DISABLED"},
		{name: "exporter none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317", "OTEL_TRACES_EXPORTER": "none"},
			url: "http://a:4317/v1/traces", protocol: "http/protobuf", sampler: "parentbased_always_on", off: "OTEL_TRACES_EXPORTER=none"},

		{name: "endpoint without scheme", flags: []string{"--otel-endpoint=collector:4317"}, wantErr: `--otel-endpoint collector:4317`},
		{name: "endpoint without host", flags: []string{"--otel-endpoint=http://:4317"}, wantErr: "has no host"},
		{name: "bad port", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:99999"}, wantErr: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "http/json", flags: []string{"--otel-endpoint=http://a:4318", "--otel-protocol=http/json"}, wantErr: "--otel-protocol http/json"},
		{name: "env protocol bad", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, wantErr: `OTEL_EXPORTER_OTLP_PROTOCOL="udp"`},
		{name: "ratio over 1", flags: []string{"--otel-sample-ratio=2"}, wantErr: "--otel-sample-ratio 2"},
		{name: "unknown sampler", env: map[string]string{"OTEL_TRACES_SAMPLER": "sometimes"}, wantErr: "OTEL_TRACES_SAMPLER"},
		{name: "bad sampler arg", env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}, wantErr: "OTEL_TRACES_SAMPLER_ARG"},
		{name: "other exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTEL_TRACES_EXPORTER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tracing.NewOptions("svc")
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.flags); err != nil {
				t.Fatal(err)
			}
			o.Getenv = envOf(tc.env)
			c, err := o.Resolve()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve() error %v, want one holding %q", err, tc.wantErr)
				}
				if strings.HasPrefix(tc.wantErr, "--") {
					var fe *cliflags.FlagError
					if !errors.As(err, &fe) {
						t.Errorf("error %v is not a cliflags.FlagError", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Enabled != tc.enabled || c.URL != tc.url || c.Protocol != tc.protocol || c.SamplerName != tc.sampler || c.Off != tc.off {
				t.Errorf("Resolve() = enabled %v url %q protocol %q sampler %q off %q, want %v %q %q %q %q",
					c.Enabled, c.URL, c.Protocol, c.SamplerName, c.Off, tc.enabled, tc.url, tc.protocol, tc.sampler, tc.off)
			}
		})
	}
}

// TestOffIsNil: a provider that is off has no tracer provider, exports
// nothing and adds no gRPC options.
func TestOffIsNil(t *testing.T) {
	o := tracing.NewOptions("svc")
	o.Getenv = envOf(nil)
	p, err := tracing.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if tp := p.TracerProvider(); tp != nil {
		t.Errorf("TracerProvider() = %v with tracing off, want nil", tp)
	}
	if n := len(tracing.DialOptions(p.TracerProvider())) + len(tracing.ServerOptions(p.TracerProvider())); n != 0 {
		t.Errorf("%d gRPC options with tracing off", n)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// TestExport: spans reach the receiver over each protocol, from the
// environment's endpoint or the flag's, with the resource's service
// name (OTEL_SERVICE_NAME over the default).
func TestExport(t *testing.T) {
	rcv := tracingtest.Start(t)
	for _, tc := range []struct {
		name    string
		o       func(*tracing.Options)
		env     map[string]string
		service string
	}{
		{name: "grpc by flag", o: func(o *tracing.Options) { o.Endpoint, o.Protocol = rcv.GRPCEndpoint(), tracing.ProtocolGRPC },
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, service: "svc"},
		{name: "http/protobuf by environment", o: func(*tracing.Options) {},
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPEndpoint(), "OTEL_SERVICE_NAME": "from-env"}, service: "from-env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tracing.NewOptions("svc")
			o.Getenv = envOf(tc.env)
			tc.o(&o)
			if tc.env["OTEL_SERVICE_NAME"] != "" {
				// resource.WithFromEnv reads the process environment.
				t.Setenv("OTEL_SERVICE_NAME", tc.env["OTEL_SERVICE_NAME"])
			}
			p, err := tracing.New(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			before := len(rcv.Spans())
			_, span := p.TracerProvider().Tracer("test").Start(context.Background(), tc.name, trace.WithTimestamp(time.Unix(100, 0)))
			span.End(trace.WithTimestamp(time.Unix(100, 5e6)))
			if err := p.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans := rcv.Spans()[before:]
			if len(spans) != 1 || spans[0].GetName() != tc.name || spans[0].Service != tc.service {
				t.Fatalf("received %v, want one span %q of service %q", spans, tc.name, tc.service)
			}
			if d := spans[0].GetEndTimeUnixNano() - spans[0].GetStartTimeUnixNano(); d != 5e6 {
				t.Errorf("duration %d ns, want 5e6", d)
			}
			if hex.EncodeToString(spans[0].GetTraceId()) != span.SpanContext().TraceID().String() {
				t.Error("trace id differs")
			}
		})
	}
}
