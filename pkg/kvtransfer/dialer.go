package kvtransfer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// Defaults of the transport, shared by Dialer and server.
const (
	// DefaultMaxFrameBytes caps the raw (decoded) length of one frame. A
	// Sender splits a larger chunk into frames of whole tokens; a server
	// rejects a frame above its cap.
	DefaultMaxFrameBytes = 1 << 20
	// DefaultConnsPerAddr is how many connections a Dialer keeps to each
	// address. One HTTP/2 connection tops out near one core's worth of
	// throughput, so bulk transfer spreads streams over several.
	DefaultConnsPerAddr = 4
	// DefaultWindowBytes is the HTTP/2 flow-control window of a stream;
	// connections get DefaultConnWindowBytes. Large static windows keep a
	// fast link busy without waiting for gRPC's BDP estimator to grow them.
	DefaultWindowBytes     = 16 << 20
	DefaultConnWindowBytes = 64 << 20
	// ioBufferBytes sizes gRPC's socket read and write buffers.
	ioBufferBytes = 256 << 10
	// DefaultKeepaliveTime and DefaultKeepaliveTimeout are a Dialer's
	// keepalive (WithKeepalive): a connection quiet for 10 s is pinged and
	// closed when no answer comes within 5 s, so a hung or dead decode
	// worker fails its transfers with UNAVAILABLE within about 15 s.
	DefaultKeepaliveTime    = grpcnet.DefaultKeepaliveTime
	DefaultKeepaliveTimeout = grpcnet.DefaultKeepaliveTimeout
	// DefaultIdleTimeout is how long a Dialer keeps the connections to an
	// address that no transfer used (WithIdleTimeout).
	DefaultIdleTimeout = 5 * time.Minute
)

// maxMessageBytes is the largest Push message a frame of maxFrame raw bytes
// can make: the encoded payload may exceed the raw length a little for
// incompressible data, plus the frame header and the message prefix.
func maxMessageBytes(maxFrame int) int { return maxFrame + maxFrame/8 + 64<<10 }

// Dialer opens KV transfers to decode workers over a pool of gRPC
// connections per address. Connections are created on the first Open to an
// address and kept while transfers use them: once an address has had no
// open transfer for the idle timeout (WithIdleTimeout; a decode worker
// that left, or is no longer chosen), the next Open to any address closes
// its connections, and gRPC drops the idle connections of a Dialer that is
// not used at all. Close closes everything. Safe for concurrent use.
type Dialer struct {
	o    dialOptions
	link *link // nil without pacing

	mu     sync.Mutex
	closed bool
	pools  map[string]*connPool
}

// connPool is the set of connections to one address.
type connPool struct {
	conns   []*grpc.ClientConn
	clients []pdservev1.KVTransferServiceClient
	next    atomic.Uint64

	// Guarded by Dialer.mu.
	active int       // transfers open (from Open until their stream ends)
	last   time.Time // when active last changed
}

func (p *connPool) pick() pdservev1.KVTransferServiceClient {
	return p.clients[(p.next.Add(1)-1)%uint64(len(p.clients))]
}

// NewDialer returns a Dialer. It opens no connection yet.
func NewDialer(opts ...DialOption) *Dialer {
	o := dialOptions{
		connsPerAddr: DefaultConnsPerAddr,
		logger:       zap.NewNop(),
		maxFrame:     DefaultMaxFrameBytes,
		now:          time.Now,
		sleep:        sleepCtx,
		keepalive:    keepalive.ClientParameters{Time: DefaultKeepaliveTime, Timeout: DefaultKeepaliveTimeout, PermitWithoutStream: true},
		idleTimeout:  DefaultIdleTimeout,
	}
	for _, opt := range opts {
		opt.applyDial(&o)
	}
	d := &Dialer{o: o, pools: make(map[string]*connPool)}
	if o.linkGbps > 0 {
		d.link = newLink(o.linkGbps)
	}
	return d
}

func (d *Dialer) grpcOptions(id, role string) []grpc.DialOption {
	creds := insecure.NewCredentials()
	switch {
	case role != "" && d.o.pullTLS != nil:
		if cfg := d.o.pullTLS(role, id); cfg != nil {
			creds = credentials.NewTLS(cfg)
		}
	case d.o.peerTLS != nil:
		if cfg := d.o.peerTLS(id); cfg != nil {
			creds = credentials.NewTLS(cfg)
		}
	case d.o.tls != nil:
		creds = credentials.NewTLS(d.o.tls)
	}
	msg := maxMessageBytes(d.o.maxFrame)
	return append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithInitialWindowSize(DefaultWindowBytes),
		grpc.WithInitialConnWindowSize(DefaultConnWindowBytes),
		grpc.WithReadBufferSize(ioBufferBytes),
		grpc.WithWriteBufferSize(ioBufferBytes),
		grpc.WithKeepaliveParams(d.o.keepalive),
		grpc.WithIdleTimeout(d.o.idleTimeout),
		// A retried stream would keep every sent frame buffered until the
		// call commits; the transfer is resent by the caller instead.
		grpc.WithDisableRetry(),
		grpc.WithDefaultCallOptions(
			grpc.CallContentSubtype(CodecName),
			grpc.MaxCallSendMsgSize(msg),
			grpc.MaxCallRecvMsgSize(msg),
		),
	}, d.o.grpcOpts...)
}

// client returns the next client for addr (and the peer id, with
// WithPeerTLS; and its role for a pull, role "" for a push, with
// WithPullTLS), creating its connections on first use, and counts a
// transfer open on them until release. It closes the connections of other
// addresses idle for the idle timeout.
func (d *Dialer) client(addr, id, role string) (pdservev1.KVTransferServiceClient, *connPool, error) {
	key := addr
	switch {
	case role != "" && d.o.pullTLS != nil:
		key = addr + "\x00" + id + "\x00" + role
	case d.o.peerTLS != nil:
		key = addr + "\x00" + id
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, nil, ErrClosed
	}
	now := d.o.now()
	idle := d.sweepLocked(key, now)
	defer closeConns(idle, d.o.logger)
	defer d.mu.Unlock()
	p, ok := d.pools[key]
	if !ok {
		p = &connPool{}
		opts := d.grpcOptions(id, role)
		for range d.o.connsPerAddr {
			cc, err := grpc.NewClient(addr, opts...)
			if err != nil {
				for _, c := range p.conns {
					_ = c.Close()
				}
				return nil, nil, fmt.Errorf("kvtransfer: connect %s: %w", addr, err)
			}
			p.conns = append(p.conns, cc)
			p.clients = append(p.clients, pdservev1.NewKVTransferServiceClient(cc))
		}
		d.pools[key] = p
		d.o.logger.Debug("kvtransfer: connections created", zap.String("addr", addr), zap.Int("conns", len(p.conns)))
	}
	p.active++
	p.last = now
	return p.pick(), p, nil
}

// release ends the count of one transfer on p.
func (d *Dialer) release(p *connPool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p.active--
	p.last = d.o.now()
}

// sweepLocked removes the pools other than keep's with no transfer open
// for the idle timeout and returns them, to be closed without d.mu.
func (d *Dialer) sweepLocked(keep string, now time.Time) map[string]*connPool {
	var idle map[string]*connPool
	for addr, p := range d.pools {
		if addr != keep && p.active == 0 && now.Sub(p.last) >= d.o.idleTimeout {
			if idle == nil {
				idle = make(map[string]*connPool)
			}
			idle[addr] = p
			delete(d.pools, addr)
		}
	}
	return idle
}

// closeConns closes the connections of pools (transfers on them are
// over), logging what it closed.
func closeConns(pools map[string]*connPool, log *zap.Logger) {
	for addr, p := range pools {
		for _, cc := range p.conns {
			_ = cc.Close() // nothing to undo: the connection is gone either way
		}
		log.Debug("kvtransfer: idle connections closed", zap.String("addr", addr), zap.Int("conns", len(p.conns)))
	}
}

// Open starts a transfer to the decode worker at addr (host:port) and waits
// until the worker accepted the header (its Receiver.Begin returned). The
// transfer lives until it is committed or aborted, or ctx ends, whichever
// comes first.
//
// The stream header names the codec by its own name (codec.Codec.Name),
// also when h.Codec is an alias, so that every peer knows it; Header
// returns it so. Every frame carries h.DType; the worker refuses the
// transfer when its own KV dtype differs.
//
// Errors: ErrBadHeader, codec.ErrUnknownCodec, codec.ErrDType (the codec
// cannot code h.DType, such as bf16 on q8_0), ErrClosed, or the worker's
// gRPC status (FAILED_PRECONDITION without a reservation,
// RESOURCE_EXHAUSTED beyond it, INVALID_ARGUMENT when the codec cannot code
// its KV dtype, UNAVAILABLE when it cannot be reached, ...), all wrapped.
func (d *Dialer) Open(ctx context.Context, addr string, h StreamHeader) (*Sender, error) {
	if err := h.Validate(); err != nil {
		return nil, err
	}
	c, err := codec.ByName(h.Codec)
	if err != nil {
		return nil, fmt.Errorf("kvtransfer: open %s: %w", h.RequestID, err)
	}
	if err := c.Supports(h.DType); err != nil {
		return nil, fmt.Errorf("kvtransfer: open %s: %w", h.RequestID, err)
	}
	h.Codec = c.Name()
	cl, pool, err := d.client(addr, peerID(ctx), "")
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancelCause(ctx)
	// Every end of the transfer cancels sctx: a failed Open, Commit, a
	// failed Send, Abort, or ctx.
	context.AfterFunc(sctx, func() { d.release(pool) })
	stream, err := cl.Push(sctx)
	if err != nil {
		cancel(err)
		return nil, fmt.Errorf("kvtransfer: open %s to %s: %w", h.RequestID, addr, err)
	}
	s := &Sender{
		d:      d,
		h:      h,
		codec:  c,
		stream: stream,
		ctx:    sctx,
		cancel: cancel,
		next:   make([]int, h.Layers),
	}
	for l := range s.next {
		s.next[l] = h.Start
	}
	req := &pdservev1.PushRequest{Msg: &pdservev1.PushRequest_Header{Header: h.proto()}}
	if err := stream.SendMsg(req); err != nil {
		err = s.streamErr(err)
		cancel(err)
		return nil, fmt.Errorf("kvtransfer: open %s to %s: %w", h.RequestID, addr, err)
	}
	// The worker sends response headers once Begin accepted the transfer;
	// without them the stream ended and RecvMsg returns why.
	if md, _ := stream.Header(); md == nil {
		err := s.streamErr(nil)
		cancel(err)
		return nil, fmt.Errorf("kvtransfer: open %s to %s: %w", h.RequestID, addr, err)
	}
	return s, nil
}

// Close closes every connection. Transfers still open fail with
// CANCELED/UNAVAILABLE; Open fails with ErrClosed afterwards. Close is
// idempotent.
func (d *Dialer) Close() error {
	d.mu.Lock()
	pools := d.pools
	d.pools = nil
	d.closed = true
	d.mu.Unlock()
	var first error
	for _, p := range pools {
		for _, cc := range p.conns {
			if err := cc.Close(); err != nil && first == nil {
				first = fmt.Errorf("kvtransfer: close: %w", err)
			}
		}
	}
	return first
}
