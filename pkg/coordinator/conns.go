package coordinator

import (
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// conns caches one gRPC client connection per worker address. A
// connection to a worker that left the membership is closed by retain
// (the housekeeping loop); one to a hung worker is closed by keepalive.
// Safe for concurrent use.
type conns struct {
	opts  []grpc.DialOption
	mu    sync.Mutex
	byAdr map[string]*grpc.ClientConn
}

// newConns returns an empty cache whose connections use creds (TLS, or
// plaintext) and opts (keepalive, the coordinator's token).
func newConns(creds credentials.TransportCredentials, opts ...grpc.DialOption) *conns {
	return &conns{opts: append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...), byAdr: make(map[string]*grpc.ClientConn)}
}

// get returns the connection to addr, creating it (lazily connecting) on
// first use.
func (c *conns) get(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.byAdr[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.opts...)
	if err != nil {
		return nil, fmt.Errorf("coordinator: dial %s: %w", addr, err)
	}
	c.byAdr[addr] = cc
	return cc, nil
}

// retain closes the connections whose address is not in keep. Calls in
// flight on a closed connection fail with CANCELED; the request recovers
// or fails as for a lost worker.
func (c *conns) retain(keep map[string]bool) {
	c.mu.Lock()
	var gone []*grpc.ClientConn
	for addr, cc := range c.byAdr {
		if !keep[addr] {
			gone = append(gone, cc)
			delete(c.byAdr, addr)
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
	return len(c.byAdr)
}
