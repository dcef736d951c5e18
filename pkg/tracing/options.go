package tracing

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/internal/cliflags"
)

// OTLP protocols (--otel-protocol, OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// Options configure the OTLP trace export of one process. The zero value
// with SampleRatio -1 (NewOptions) takes everything from the environment;
// tracing is off unless an endpoint is given by flag or environment.
type Options struct {
	// Endpoint is --otel-endpoint: the OTLP receiver's base URL
	// (http://host:port or https://host:port), as
	// OTEL_EXPORTER_OTLP_ENDPOINT: over http/protobuf the traces go to
	// its path + v1/traces. Empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (a
	// full URL, used as it is), then OTEL_EXPORTER_OTLP_ENDPOINT; none of
	// them: tracing is off.
	Endpoint string
	// Protocol is --otel-protocol: grpc or http/protobuf. Empty:
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, then
	// OTEL_EXPORTER_OTLP_PROTOCOL, then http/protobuf (the
	// specification's default).
	Protocol string
	// SampleRatio is --otel-sample-ratio in [0, 1]: new traces are
	// sampled with that probability, a request that comes with a W3C
	// traceparent follows its sampled flag (parentbased_traceidratio).
	// Negative: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, then
	// parentbased_always_on.
	SampleRatio float64
	// ServiceName is the default service.name of the process's resource
	// (e.g. "pdserve-coordinator"); OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it. Set in code, not a flag.
	ServiceName string
	// Getenv reads the environment; nil: os.Getenv. Tests set it.
	Getenv func(string) string
}

// NewOptions returns the flag defaults: everything from the environment.
func NewOptions(service string) Options {
	return Options{SampleRatio: -1, ServiceName: service}
}

// AddFlags registers --otel-endpoint, --otel-protocol and
// --otel-sample-ratio on fs with o's values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Endpoint, "otel-endpoint", o.Endpoint, "OTLP receiver of the traces, http://host:port or https://host:port, as OTEL_EXPORTER_OTLP_ENDPOINT (empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT; none: no tracing)")
	fs.StringVar(&o.Protocol, "otel-protocol", o.Protocol, "OTLP protocol of the trace export: grpc or http/protobuf (empty: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL, then http/protobuf)")
	fs.Float64Var(&o.SampleRatio, "otel-sample-ratio", o.SampleRatio, "fraction of new traces sampled, 0..1; a request with a traceparent follows its sampled flag (negative: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, then every trace)")
}

// Config is the resolved export configuration.
type Config struct {
	// Enabled: an endpoint was given and neither OTEL_SDK_DISABLED=true
	// nor OTEL_TRACES_EXPORTER=none turned tracing off.
	Enabled bool
	// Off says why tracing is off: "no endpoint", "OTEL_SDK_DISABLED",
	// "OTEL_TRACES_EXPORTER=none"; "" when Enabled.
	Off string
	// URL is where spans go: the gRPC target's URL, or the full
	// http/protobuf URL (path included).
	URL      string
	Protocol string
	// Sampler and SamplerName (OTEL_TRACES_SAMPLER's vocabulary, with its
	// argument) are the sampler of new spans.
	Sampler     sdktrace.Sampler
	SamplerName string
}

// Resolve combines the flags and the environment, flags first. Errors
// name the flag or variable with the bad value: an endpoint that is not
// an http(s) URL with a host, an unknown protocol (http/json included:
// the Go SDK does not export it), an unknown sampler, a ratio outside
// [0, 1], an exporter other than otlp or none.
func (o Options) Resolve() (Config, error) {
	env := o.Getenv
	if env == nil {
		env = os.Getenv
	}
	get := func(k string) string { return strings.TrimSpace(env(k)) }
	var errs []error
	var c Config

	endpoint, source, signal := o.Endpoint, "otel-endpoint", false
	switch {
	case endpoint != "":
	case get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		endpoint, source, signal = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", true
	case get("OTEL_EXPORTER_OTLP_ENDPOINT") != "":
		endpoint, source = get("OTEL_EXPORTER_OTLP_ENDPOINT"), "OTEL_EXPORTER_OTLP_ENDPOINT"
	}

	psource := "otel-protocol"
	c.Protocol = o.Protocol
	switch {
	case c.Protocol != "":
	case get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") != "":
		c.Protocol, psource = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	case get("OTEL_EXPORTER_OTLP_PROTOCOL") != "":
		c.Protocol, psource = get("OTEL_EXPORTER_OTLP_PROTOCOL"), "OTEL_EXPORTER_OTLP_PROTOCOL"
	default:
		c.Protocol = ProtocolHTTPProtobuf
	}
	switch c.Protocol {
	case ProtocolGRPC, ProtocolHTTPProtobuf:
	default:
		errs = append(errs, badSetting(psource, c.Protocol, fmt.Errorf("must be %s or %s", ProtocolGRPC, ProtocolHTTPProtobuf)))
	}

	if endpoint != "" {
		u, err := endpointURL(endpoint, c.Protocol, signal)
		if err != nil {
			errs = append(errs, badSetting(source, endpoint, err))
		}
		c.URL = u
	}

	var err error
	if c.Sampler, c.SamplerName, err = o.sampler(get); err != nil {
		errs = append(errs, err)
	}

	switch exp := get("OTEL_TRACES_EXPORTER"); exp {
	case "", "otlp", "none":
	default:
		errs = append(errs, badSetting("OTEL_TRACES_EXPORTER", exp, errors.New("must be otlp or none (pdserve exports OTLP only)")))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("tracing: invalid options: %w", err)
	}
	switch {
	case strings.EqualFold(get("OTEL_SDK_DISABLED"), "true"):
		c.Off = "OTEL_SDK_DISABLED"
	case get("OTEL_TRACES_EXPORTER") == "none":
		c.Off = "OTEL_TRACES_EXPORTER=none"
	case c.URL == "":
		c.Off = "no endpoint"
	default:
		c.Enabled = true
	}
	return c, nil
}

// Validate reports Resolve's error.
func (o Options) Validate() error {
	_, err := o.Resolve()
	return err
}

// LogFields returns the effective settings as zap fields: otel_endpoint,
// otel_protocol and otel_sample_ratio (the flags' names; the resolved
// values, from the environment where no flag was given), the sampler,
// and whether tracing is on (otel_off says why not).
func (o Options) LogFields() []zap.Field {
	c, err := o.Resolve()
	if err != nil {
		return []zap.Field{zap.NamedError("otel_error", err)}
	}
	f := []zap.Field{zap.Bool("otel_tracing", c.Enabled), zap.String("otel_endpoint", redact(c.URL)),
		zap.String("otel_protocol", c.Protocol), zap.Float64("otel_sample_ratio", o.SampleRatio), zap.String("otel_sampler", c.SamplerName)}
	if !c.Enabled {
		f = append(f, zap.String("otel_off", c.Off))
	}
	return f
}

// redact drops the user info of a URL for the log.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	u.User = nil
	return u.String()
}

// endpointURL checks endpoint and returns the URL spans go to: for
// http/protobuf a base endpoint (not signal-specific) gets v1/traces
// appended to its path, as the specification says.
func endpointURL(endpoint, protocol string, signal bool) (string, error) {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return "", err
	case u.Scheme != "http" && u.Scheme != "https":
		return "", errors.New("must be an http:// or https:// URL (e.g. http://otel-collector:4317)")
	case u.Host == "" || u.Hostname() == "":
		return "", errors.New("has no host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
			return "", fmt.Errorf("port %q is not in 1..65535", p)
		}
	}
	if protocol == ProtocolHTTPProtobuf && !signal {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	return u.String(), nil
}

// sampler returns the sampler of --otel-sample-ratio, or of
// OTEL_TRACES_SAMPLER(_ARG), or parentbased_always_on.
func (o Options) sampler(get func(string) string) (sdktrace.Sampler, string, error) {
	if o.SampleRatio >= 0 {
		if o.SampleRatio > 1 {
			return nil, "", badSetting("otel-sample-ratio", strconv.FormatFloat(o.SampleRatio, 'g', -1, 64), errors.New("must be in [0, 1]"))
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio)),
			"parentbased_traceidratio=" + strconv.FormatFloat(o.SampleRatio, 'g', -1, 64), nil
	}
	name := get("OTEL_TRACES_SAMPLER")
	if name == "" {
		name = "parentbased_always_on"
	}
	ratio := 1.0
	arg := get("OTEL_TRACES_SAMPLER_ARG")
	if strings.HasSuffix(name, "traceidratio") && arg != "" {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, "", badSetting("OTEL_TRACES_SAMPLER_ARG", arg, errors.New("must be a ratio in [0, 1]"))
		}
		ratio = r
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), name, nil
	case "always_off":
		return sdktrace.NeverSample(), name, nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), name + "=" + strconv.FormatFloat(ratio, 'g', -1, 64), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), name, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), name, nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), name + "=" + strconv.FormatFloat(ratio, 'g', -1, 64), nil
	}
	return nil, "", badSetting("OTEL_TRACES_SAMPLER", name, errors.New("must be always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"))
}

// badSetting is the error of a flag (name without dashes) or an
// environment variable (upper case) with a bad value.
func badSetting(name, value string, err error) error {
	if strings.HasPrefix(name, "OTEL_") {
		return fmt.Errorf("environment %s=%q: %w", name, value, err)
	}
	return cliflags.BadFlag(name, value, err)
}
