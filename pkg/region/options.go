package region

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/grpcnet"
)

// Options are a coordinator's region settings. The zero value is no
// region: nothing federates and nothing is forwarded.
type Options struct {
	// Name is the region's name (--region), a NATS subject token; the
	// NATS gateway of its embedded server is named after it.
	Name string
	// GatewayListen is the embedded NATS server's gateway listener
	// (--region-gateway-listen, host:port; port 0 picks a free one).
	// Empty: the server accepts no gateway connections (it may dial).
	GatewayListen string
	// Gateways are the other regions' gateways (--region-gateway
	// NAME=nats://HOST:PORT, repeatable), by region name.
	Gateways Gateways
	// AdvertiseURL is where peers forward requests to this region
	// (--region-advertise-url, https://HOST:PORT). The coordinator serves
	// the forwarded requests there, with mutual TLS, on the URL's port
	// (on its host when that is an IP address, else on every interface);
	// port 0 picks a free one, advertised as it is bound.
	AdvertiseURL string
	// TLS is the region's mutual TLS (--region-tls-cert, --region-tls-key,
	// --region-tls-ca): the certificate this coordinator serves to and
	// presents to peers, and the CA that signs every region's
	// certificates. With it the gateways are mutual TLS too.
	TLS grpcnet.TLSOptions
}

// Gateways are the remote gateways by region name; a flag.Value taking
// NAME=nats://HOST:PORT once per flag.
type Gateways map[string][]*url.URL

// String lists the gateways as the flag takes them, sorted.
func (g *Gateways) String() string {
	if g == nil {
		return ""
	}
	var out []string
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for k := range *g {
			if !yield(k) {
				return
			}
		}
	}) {
		for _, u := range (*g)[n] {
			out = append(out, n+"="+u.String())
		}
	}
	return strings.Join(out, ",")
}

// Set adds one NAME=nats://HOST:PORT.
func (g *Gateways) Set(v string) error {
	name, raw, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want NAME=nats://HOST:PORT, got %q", v)
	}
	if err := control.ValidToken(name); err != nil {
		return fmt.Errorf("region name %q: %w", name, err)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "nats" || u.Port() == "" || u.Hostname() == "" || u.User != nil || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("gateway of region %s: want nats://HOST:PORT (no credentials), got %q", name, raw)
	}
	if *g == nil {
		*g = Gateways{}
	}
	(*g)[name] = append((*g)[name], u)
	return nil
}

// AddFlags registers the region flags on fs with o's values as defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Name, "region", o.Name, "this deployment's region name; with it the coordinator federates with the regions its NATS server reaches through gateways, and forwards a request another region serves within its TTFT budget when this one cannot (empty: no regions)")
	fs.StringVar(&o.GatewayListen, "region-gateway-listen", o.GatewayListen, "HOST:PORT of the embedded NATS server's gateway listener, which the other regions' NATS servers dial (needs --region; empty: none)")
	fs.Var(&o.Gateways, "region-gateway", "NAME=nats://HOST:PORT: another region's NATS gateway, dialed by the embedded NATS server (repeatable; needs --region)")
	fs.StringVar(&o.AdvertiseURL, "region-advertise-url", o.AdvertiseURL, "https://HOST:PORT where the other regions' coordinators forward requests to this one; served with mutual TLS on its port (required with --region)")
	fs.StringVar(&o.TLS.CertFile, "region-tls-cert", o.TLS.CertFile, "PEM certificate (chain) of this region's coordinator: served to, and presented to, the other regions' coordinators and NATS gateways (required with --region)")
	fs.StringVar(&o.TLS.KeyFile, "region-tls-key", o.TLS.KeyFile, "PEM private key of --region-tls-cert")
	fs.StringVar(&o.TLS.CAFile, "region-tls-ca", o.TLS.CAFile, "PEM CA certificates that sign every region's --region-tls-cert: forwarded requests and gateway connections are mutual TLS verified against them (required with --region)")
}

// Enabled reports whether a region is configured.
func (o Options) Enabled() bool { return o.Name != "" }

// given reports whether any region setting is set.
func (o Options) given() bool {
	return o.Name != "" || o.GatewayListen != "" || len(o.Gateways) > 0 || o.AdvertiseURL != "" || o.TLS.Enabled()
}

// Validate reports every problem in one error: settings without --region,
// a bad name, listener, gateway or URL, missing or invalid TLS files.
// nil for the zero value.
func (o Options) Validate() error {
	if !o.given() {
		return nil
	}
	var errs []error
	if o.Name == "" {
		return errors.New("region: --region-* settings need --region")
	}
	if err := control.ValidToken(o.Name); err != nil {
		errs = append(errs, fmt.Errorf("region: --region %q: %w", o.Name, err))
	}
	if o.GatewayListen != "" {
		if _, _, err := net.SplitHostPort(o.GatewayListen); err != nil {
			errs = append(errs, fmt.Errorf("region: --region-gateway-listen %q: %w", o.GatewayListen, err))
		}
	}
	if _, ok := o.Gateways[o.Name]; ok {
		errs = append(errs, fmt.Errorf("region: --region-gateway names this region (%s) itself", o.Name))
	}
	if _, err := o.listenAddr(); err != nil {
		errs = append(errs, err)
	}
	if o.TLS.CertFile == "" || o.TLS.KeyFile == "" || o.TLS.CAFile == "" {
		errs = append(errs, errors.New("region: --region needs --region-tls-cert, --region-tls-key and --region-tls-ca (regions forward over mutual TLS only)"))
	} else if o.TLS.ServerName != "" {
		errs = append(errs, errors.New("region: TLS server name is not a region setting"))
	} else if err := o.TLS.Validate(grpcnet.TLSServe | grpcnet.TLSDial); err != nil {
		errs = append(errs, fmt.Errorf("region: %w", err))
	}
	return errors.Join(errs...)
}

// listenAddr is where the forwarded requests are served: the advertised
// URL's port, on its host when that is an IP address.
func (o Options) listenAddr() (string, error) {
	u, err := url.Parse(o.AdvertiseURL)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.Port() == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("region: --region-advertise-url: want https://HOST:PORT, got %q", o.AdvertiseURL)
	}
	host := ""
	if net.ParseIP(u.Hostname()) != nil {
		host = u.Hostname()
	}
	return net.JoinHostPort(host, u.Port()), nil
}

// LogFields returns the settings as zap fields.
func (o Options) LogFields() []zap.Field {
	return []zap.Field{
		zap.String("region", o.Name), zap.String("region_gateway_listen", o.GatewayListen),
		zap.String("region_gateway", o.Gateways.String()), zap.String("region_advertise_url", o.AdvertiseURL),
		zap.String("region_tls_cert", o.TLS.CertFile), zap.String("region_tls_key", o.TLS.KeyFile), zap.String("region_tls_ca", o.TLS.CAFile),
	}
}
