package coordinator

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

// TestRetainKeepsCallsInFlight: a worker that left the membership (a late
// heartbeat under load) keeps the streams it is serving; its connection
// closes when the last one ends. Before, retain closed it at once and the
// stream failed with CANCELED ("the client connection is closing").
func TestRetainKeepsCallsInFlight(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	c := plainConns()
	defer c.closeAll()
	p := peer{id: "decode-0", role: "decode", addr: lis.Addr().String()}
	cc, err := c.get(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{Service: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil { // SERVICE_UNKNOWN: the stream is up
		t.Fatal(err)
	}
	c.retain(nil)
	if c.len() != 0 {
		t.Fatalf("%d connections cached after retain, want 0", c.len())
	}
	hs.SetServingStatus("s", healthpb.HealthCheckResponse_SERVING)
	r, err := st.Recv()
	if err != nil {
		t.Fatalf("the stream in flight failed when its peer left the membership: %v", err)
	}
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("status %v", r.GetStatus())
	}
	cancel() // the last call ends: the retired connection closes
	for cc.GetState() != connectivity.Shutdown {
		if !cc.WaitForStateChange(context.Background(), cc.GetState()) {
			t.Fatal("unreachable")
		}
	}
}
