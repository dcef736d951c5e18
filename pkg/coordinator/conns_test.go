package coordinator

import (
	"testing"

	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

func TestConnsCacheAndRetain(t *testing.T) {
	c := newConns(insecure.NewCredentials())
	defer c.closeAll()
	a1, err := c.get("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := c.get("127.0.0.1:1")
	b, _ := c.get("127.0.0.1:2")
	if a1 != a2 {
		t.Errorf("two connections for one address")
	}
	if c.len() != 2 {
		t.Fatalf("%d connections cached, want 2", c.len())
	}
	c.retain(map[string]bool{"127.0.0.1:1": true})
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
