package coordinator

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// peer is a worker as the coordinator dials it: the id and role its
// heartbeat claims and its gRPC address. A connection belongs to one
// peer: its TLS handshake verifies that the certificate names the role
// (and the id), and its credentials are signed for that id.
type peer struct {
	id, role, addr string
}

// key is the peer's cache key.
func (p peer) key() string { return p.role + "/" + p.id + "@" + p.addr }

// conns caches one gRPC client connection per peer. A connection to a
// worker that left the membership (the housekeeping loop's retain) is
// retired: closed at once when no call is in flight on it, else when its
// last call ends, so that a worker whose heartbeat was only late does not
// lose the streams it is serving; one to a hung worker is closed by
// keepalive, which ends its calls. Safe for concurrent use.
type conns struct {
	dial  func(peer) []grpc.DialOption
	mu    sync.Mutex
	byKey map[string]*conn
	// retired are the connections retain dropped with calls in flight,
	// until their last call ends (or closeAll).
	retired map[*conn]bool
}

// conn is one cached connection and the calls in flight on it, counted
// by its stats handler (an RPC's Begin to its End: a stream's End comes
// when it finished, failed or was cancelled).
type conn struct {
	cc       *grpc.ClientConn
	c        *conns
	inflight int // guarded by c.mu
	retired  bool
}

// TagRPC implements stats.Handler.
func (k *conn) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC implements stats.Handler: it counts the calls in flight and
// closes a retired connection when its last one ends.
func (k *conn) HandleRPC(_ context.Context, st stats.RPCStats) {
	switch st.(type) {
	case *stats.Begin:
		k.c.mu.Lock()
		k.inflight++
		k.c.mu.Unlock()
	case *stats.End:
		k.c.mu.Lock()
		k.inflight--
		last := k.retired && k.inflight == 0 && k.c.retired[k]
		if last {
			delete(k.c.retired, k)
		}
		k.c.mu.Unlock()
		if last {
			// Not from the call's own goroutine: Close waits for the
			// connection's goroutines, one of which may be this one's.
			go func() { _ = k.cc.Close() }()
		}
	}
}

// TagConn implements stats.Handler.
func (k *conn) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn implements stats.Handler.
func (k *conn) HandleConn(context.Context, stats.ConnStats) {}

// newConns returns an empty cache whose connections to a peer use
// dial(peer): transport credentials (TLS verifying the peer, or
// plaintext), keepalive and the coordinator's per-call credentials.
func newConns(dial func(peer) []grpc.DialOption) *conns {
	return &conns{dial: dial, byKey: make(map[string]*conn), retired: make(map[*conn]bool)}
}

// get returns the connection to p, creating it (lazily connecting) on
// first use.
func (c *conns) get(p peer) (*grpc.ClientConn, error) {
	k := p.key()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cn, ok := c.byKey[k]; ok {
		return cn.cc, nil
	}
	cn := &conn{c: c}
	cc, err := grpc.NewClient(p.addr, append(c.dial(p), grpc.WithStatsHandler(cn))...)
	if err != nil {
		return nil, fmt.Errorf("coordinator: dial %s %s at %s: %w", p.role, p.id, p.addr, err)
	}
	cn.cc = cc
	c.byKey[k] = cn
	return cc, nil
}

// retain retires the connections whose peer key is not in keep: each is
// closed now if no call is in flight on it, else when its last call ends.
// A call started on a closed connection fails with CANCELED; the request
// recovers or fails as for a lost worker.
func (c *conns) retain(keep map[string]bool) {
	c.mu.Lock()
	var gone []*grpc.ClientConn
	for k, cn := range c.byKey {
		if keep[k] {
			continue
		}
		delete(c.byKey, k)
		cn.retired = true
		if cn.inflight == 0 {
			gone = append(gone, cn.cc)
		} else {
			c.retired[cn] = true
		}
	}
	c.mu.Unlock()
	for _, cc := range gone {
		_ = cc.Close() // a close error leaves nothing to undo
	}
}

// closeAll closes every connection, the retired ones with calls in
// flight too.
func (c *conns) closeAll() {
	c.retain(nil)
	c.mu.Lock()
	var gone []*grpc.ClientConn
	for cn := range c.retired {
		gone = append(gone, cn.cc)
	}
	clear(c.retired)
	c.mu.Unlock()
	for _, cc := range gone {
		_ = cc.Close()
	}
}

// len returns the number of cached connections.
func (c *conns) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byKey)
}
