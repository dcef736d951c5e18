package kvtransfer

import (
	"context"
	"crypto/tls"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// DialOption configures a Dialer.
type DialOption interface{ applyDial(*dialOptions) }

// ServerOption configures the server side (Register, GRPCServerOptions).
type ServerOption interface{ applyServer(*serverOptions) }

// Option configures both sides.
type Option interface {
	DialOption
	ServerOption
}

type dialOptions struct {
	connsPerAddr int
	linkGbps     float64
	tls          *tls.Config
	peerTLS      func(id string) *tls.Config
	pullTLS      func(role, id string) *tls.Config
	logger       *zap.Logger
	maxFrame     int
	now          func() time.Time
	sleep        func(context.Context, time.Duration) error
	grpcOpts     []grpc.DialOption
	keepalive    keepalive.ClientParameters
	idleTimeout  time.Duration
}

type serverOptions struct {
	logger   *zap.Logger
	maxFrame int
	now      func() time.Time
	metrics  Metrics
	pull     PullSource     // nil: no pulls served
	seqs     SequenceSource // nil: no sequence pulls served
}

type dialFunc func(*dialOptions)

func (f dialFunc) applyDial(o *dialOptions) { f(o) }

type serverFunc func(*serverOptions)

func (f serverFunc) applyServer(o *serverOptions) { f(o) }

type bothFunc struct {
	dial   func(*dialOptions)
	server func(*serverOptions)
}

func (f bothFunc) applyDial(o *dialOptions)     { f.dial(o) }
func (f bothFunc) applyServer(o *serverOptions) { f.server(o) }

// WithConnsPerAddr sets how many connections a Dialer opens to each address
// (n ≥ 1; default DefaultConnsPerAddr). Streams are spread over them round
// robin.
func WithConnsPerAddr(n int) DialOption {
	return dialFunc(func(o *dialOptions) {
		if n >= 1 {
			o.connsPerAddr = n
		}
	})
}

// WithLinkGbps paces every Sender of a Dialer as if its frames crossed one
// link of g gigabits per second (10⁹ bit/s) shared by all of them, first
// come first served: each Send returns no earlier than its bytes would have
// crossed that link. A Send is charged fullBytes × (wire bytes / raw bytes)
// of its frames, so a scaled-down payload still takes the time of the
// model's true KV size and a compressing codec saves link time. g ≤ 0 (the
// default) disables pacing.
func WithLinkGbps(g float64) DialOption {
	return dialFunc(func(o *dialOptions) { o.linkGbps = g })
}

// WithTLS makes a Dialer use TLS with cfg (nil: plaintext, the default).
// cfg must not be modified after the call. The server side takes its TLS
// credentials from the grpc.Server.
func WithTLS(cfg *tls.Config) DialOption {
	return dialFunc(func(o *dialOptions) { o.tls = cfg })
}

// WithKeepalive sets a Dialer's keepalive pings (default: every
// DefaultKeepaliveTime of quiet, DefaultKeepaliveTimeout to answer, also
// without a transfer open): a decode worker that stops answering fails
// the transfers to it with UNAVAILABLE once a ping goes unanswered.
// gRPC raises a Time under 10 s to 10 s. Zero fields keep the defaults;
// PermitWithoutStream is always set.
func WithKeepalive(p keepalive.ClientParameters) DialOption {
	return dialFunc(func(o *dialOptions) {
		if p.Time > 0 {
			o.keepalive.Time = p.Time
		}

		if p.Timeout > 0 {
			o.keepalive.Timeout = p.Timeout
		}
	})
}

// WithIdleTimeout sets how long a Dialer keeps the connections to an
// address without an open transfer (d > 0; default DefaultIdleTimeout);
// see Dialer. The clock is WithClock's.
func WithIdleTimeout(d time.Duration) DialOption {
	return dialFunc(func(o *dialOptions) {
		if d > 0 {
			o.idleTimeout = d
		}
	})
}

// WithGRPCDialOptions appends options to those a Dialer passes to
// grpc.NewClient (after its own, so they win).
func WithGRPCDialOptions(opts ...grpc.DialOption) DialOption {
	return dialFunc(func(o *dialOptions) { o.grpcOpts = append(o.grpcOpts, opts...) })
}

// WithLogger sets the logger (default: none).
func WithLogger(l *zap.Logger) Option {
	return bothFunc{
		dial: func(o *dialOptions) {
			if l != nil {
				o.logger = l
			}
		},
		server: func(o *serverOptions) {
			if l != nil {
				o.logger = l
			}
		},
	}
}

// WithPeerTLS makes the TLS configuration of the connections to a decode
// worker depend on its id (the one WithPeerID put in Open's context), so
// that each can verify the certificate names that worker: f returns the
// configuration for id. A Dialer then keeps connections per address and
// id. It takes precedence over WithTLS.
func WithPeerTLS(f func(id string) *tls.Config) DialOption {
	return dialFunc(func(o *dialOptions) { o.peerTLS = f })
}

// WithPullTLS makes the TLS configuration of a Pull's connections to a
// peer worker depend on the peer's role and id (PullRequest.Peer), so that
// each verifies the certificate names that worker in that role: f returns
// the configuration for them. Pulls then keep connections per address,
// id and role. Without it a pull uses WithTLS's configuration (or
// WithPeerTLS's for the id).
func WithPullTLS(f func(role, id string) *tls.Config) DialOption {
	return dialFunc(func(o *dialOptions) { o.pullTLS = f })
}

type peerIDKey struct{}

// WithPeerID returns ctx naming id as the decode worker Open dials (its
// heartbeat id), for WithPeerTLS.
func WithPeerID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, peerIDKey{}, id)
}

func peerID(ctx context.Context) string {
	id, _ := ctx.Value(peerIDKey{}).(string)
	return id
}

// WithMaxFrameBytes sets the largest raw (decoded) length of one frame
// (n > 0; default DefaultMaxFrameBytes). A Sender splits larger chunks into
// frames of whole tokens; a server rejects larger frames with
// INVALID_ARGUMENT. Use the same value on both sides, and pass the server's
// options to GRPCServerOptions so gRPC accepts messages of that size.
func WithMaxFrameBytes(n int) Option {
	set := func(p *int) {
		if n > 0 {
			*p = n
		}
	}
	return bothFunc{
		dial:   func(o *dialOptions) { set(&o.maxFrame) },
		server: func(o *serverOptions) { set(&o.maxFrame) },
	}
}

// WithClock replaces the clock (default time.Now) and, on a Dialer, the
// sleeper used for pacing (default: a timer that returns early with ctx's
// cause when ctx ends). sleep must return an error early when ctx ends. The
// server reads the clock for the Ack's stamps. Tests and time-scaled
// simulations use it; nil arguments keep the defaults.
func WithClock(now func() time.Time, sleep func(ctx context.Context, d time.Duration) error) Option {
	return bothFunc{
		dial: func(o *dialOptions) {
			if now != nil {
				o.now = now
			}
			if sleep != nil {
				o.sleep = sleep
			}
		},
		server: func(o *serverOptions) {
			if now != nil {
				o.now = now
			}
		},
	}
}

// WithMetrics makes the server report every transfer to m.
func WithMetrics(m Metrics) ServerOption {
	return serverFunc(func(o *serverOptions) { o.metrics = m })
}
