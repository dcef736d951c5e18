package grpcnet

import (
	"errors"
	"flag"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/pdserve/pdserve/internal/cliflags"
)

// Keepalive defaults (--grpc-keepalive-time, --grpc-keepalive-timeout):
// a peer that stops answering is found dead within about 15 s.
const (
	DefaultKeepaliveTime    = 10 * time.Second
	DefaultKeepaliveTimeout = 5 * time.Second
	// minClientKeepaliveTime is the shortest ping interval gRPC lets a
	// client use; it raises shorter ones (and logs each time).
	minClientKeepaliveTime = 10 * time.Second
	// keepaliveMinTime is how often a server lets a client ping: below
	// any client's interval, so that no client is told "too many pings".
	keepaliveMinTime = 5 * time.Second
)

// KeepaliveOptions configure HTTP/2 keepalive pings on every gRPC
// connection between components, so that a dead or hung peer (a machine
// gone, a network partition, a process stopped) is noticed within
// Time + Timeout rather than when a call times out. Both ends ping a
// connection that has been quiet for Time, also with no call open, and
// close it when no answer comes within Timeout: its calls fail with
// UNAVAILABLE and the next call reconnects. Zero fields take the
// defaults.
type KeepaliveOptions struct {
	// Time is the quiet time after which a connection is pinged
	// (--grpc-keepalive-time; default DefaultKeepaliveTime, at least 1 s).
	// gRPC clients ping at most every 10 s, so a shorter Time only
	// shortens the server's side.
	Time time.Duration
	// Timeout is how long a ping may go unanswered before the connection
	// is closed (--grpc-keepalive-timeout; default
	// DefaultKeepaliveTimeout).
	Timeout time.Duration
}

// AddFlags registers --grpc-keepalive-time and --grpc-keepalive-timeout
// on fs with o's values as defaults.
func (o *KeepaliveOptions) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Time, "grpc-keepalive-time", o.Time, "ping a gRPC connection between components after this long without traffic (clients: at least 10s); 0: "+DefaultKeepaliveTime.String())
	fs.DurationVar(&o.Timeout, "grpc-keepalive-timeout", o.Timeout, "close a gRPC connection whose ping got no answer within this long (its calls fail with UNAVAILABLE); 0: "+DefaultKeepaliveTimeout.String())
}

// Validate reports a negative duration or a Time under a second.
func (o KeepaliveOptions) Validate() error {
	var errs []error
	if o.Time < 0 || o.Time > 0 && o.Time < time.Second {
		errs = append(errs, cliflags.BadFlag("grpc-keepalive-time", o.Time.String(), errors.New("must be at least 1s (or 0: the default)")))
	}
	if o.Timeout < 0 {
		errs = append(errs, cliflags.BadFlag("grpc-keepalive-timeout", o.Timeout.String(), errors.New("must not be negative")))
	}
	return errors.Join(errs...)
}

// withDefaults fills zero fields.
func (o KeepaliveOptions) withDefaults() KeepaliveOptions {
	if o.Time == 0 {
		o.Time = DefaultKeepaliveTime
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultKeepaliveTimeout
	}
	return o
}

// LogFields returns the effective settings as zap fields.
func (o KeepaliveOptions) LogFields() []zap.Field {
	o = o.withDefaults()
	return []zap.Field{zap.Duration("grpc_keepalive_time", o.Time), zap.Duration("grpc_keepalive_timeout", o.Timeout)}
}

// ServerOptions returns a gRPC server's keepalive options: it pings quiet
// connections and lets clients ping every 5 s, also without a call open.
func (o KeepaliveOptions) ServerOptions() []grpc.ServerOption {
	o = o.withDefaults()
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: o.Time, Timeout: o.Timeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
	}
}

// ClientParameters returns a gRPC client's keepalive parameters: Time
// raised to gRPC's client minimum of 10 s, pings also without a call open.
func (o KeepaliveOptions) ClientParameters() keepalive.ClientParameters {
	o = o.withDefaults()
	return keepalive.ClientParameters{Time: max(o.Time, minClientKeepaliveTime), Timeout: o.Timeout, PermitWithoutStream: true}
}

// DialOptions returns a gRPC client's keepalive option.
func (o KeepaliveOptions) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithKeepaliveParams(o.ClientParameters())}
}
