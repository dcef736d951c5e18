package coordinator

import (
	"fmt"
	"sync"

	"google.golang.org/grpc"
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
// worker that left the membership is closed by retain (the housekeeping
// loop); one to a hung worker is closed by keepalive. Safe for concurrent
// use.
type conns struct {
	dial  func(peer) []grpc.DialOption
	mu    sync.Mutex
	byKey map[string]*grpc.ClientConn
}

// newConns returns an empty cache whose connections to a peer use
// dial(peer): transport credentials (TLS verifying the peer, or
// plaintext), keepalive and the coordinator's per-call credentials.
func newConns(dial func(peer) []grpc.DialOption) *conns {
	return &conns{dial: dial, byKey: make(map[string]*grpc.ClientConn)}
}

// get returns the connection to p, creating it (lazily connecting) on
// first use.
func (c *conns) get(p peer) (*grpc.ClientConn, error) {
	k := p.key()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.byKey[k]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(p.addr, c.dial(p)...)
	if err != nil {
		return nil, fmt.Errorf("coordinator: dial %s %s at %s: %w", p.role, p.id, p.addr, err)
	}
	c.byKey[k] = cc
	return cc, nil
}

// retain closes the connections whose peer key is not in keep. Calls in
// flight on a closed connection fail with CANCELED; the request recovers
// or fails as for a lost worker.
func (c *conns) retain(keep map[string]bool) {
	c.mu.Lock()
	var gone []*grpc.ClientConn
	for k, cc := range c.byKey {
		if !keep[k] {
			gone = append(gone, cc)
			delete(c.byKey, k)
		}
	}
	c.mu.Unlock()
	for _, cc := range gone {
		_ = cc.Close() // a close error leaves nothing to undo
	}
}

// closeAll closes every connection.
func (c *conns) closeAll() { c.retain(nil) }

// len returns the number of cached connections.
func (c *conns) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byKey)
}
