package coordinator

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// plainConns is a cache of plaintext connections without credentials.
func plainConns() *conns {
	return newConns(func(peer) []grpc.DialOption {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	})
}

func TestConnsCacheAndRetain(t *testing.T) {
	c := plainConns()
	defer c.closeAll()
	p1 := peer{id: "decode-1", role: "decode", addr: "127.0.0.1:1"}
	a1, err := c.get(p1)
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := c.get(p1)
	b, _ := c.get(peer{id: "decode-2", role: "decode", addr: "127.0.0.1:2"})
	// Another id at the same address is another peer: its connection
	// verifies and signs for that id.
	other, _ := c.get(peer{id: "decode--evil", role: "decode", addr: "127.0.0.1:1"})
	if a1 != a2 {
		t.Errorf("two connections for one peer")
	}
	if other == a1 {
		t.Errorf("one connection for two peers at one address")
	}
	if c.len() != 3 {
		t.Fatalf("%d connections cached, want 3", c.len())
	}
	c.retain(map[string]bool{p1.key(): true})
	if c.len() != 1 {
		t.Errorf("%d connections after retain, want 1", c.len())
	}
	if s := b.GetState(); s != connectivity.Shutdown {
		t.Errorf("dropped connection in state %v, want Shutdown", s)
	}
	if s := a1.GetState(); s == connectivity.Shutdown {
		t.Errorf("kept connection was closed")
	}
	c.closeAll()
	if s := a1.GetState(); s != connectivity.Shutdown || c.len() != 0 {
		t.Errorf("after closeAll: state %v, %d cached", s, c.len())
	}
}
