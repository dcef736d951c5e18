package workertest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine/ref"
)

// Engine returns the tiny reference engine (seed 1, one thread) the
// workers' tests run on and compare against, closed at the test's end.
func Engine(t testing.TB) *ref.Engine {
	t.Helper()
	e, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// Prompt returns n tokens below 250 (inside the tiny vocabulary), a
// function of n and seed alone: token i is (31·seed + 7·i) mod 250.
func Prompt(n int, seed int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = (seed*31 + int32(i)*7) % 250
	}
	return p
}

// Ctx returns a context that ends when the test does, or after 3 min, so
// that a stuck stream fails the test instead of hanging it: a hang guard,
// not a performance target, long enough for -race on a loaded 2-core
// machine (decode's TestPrefixCacheYieldsToRequests took over 30 s there).
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Server is a worker's Server as Serve drives it: its methods, given as
// functions so that either worker's fits.
type Server struct {
	// Register registers the Server's services on g.
	Register func(g grpc.ServiceRegistrar)
	// Run runs the scheduler until Stop; an error fails the test.
	Run func(ctx context.Context) error
	// Stop ends Run, and the Server's work.
	Stop func()
}

// Served is a Server Serve started.
type Served struct {
	// Addr is the gRPC server's loopback address.
	Addr string
	// Conn is a client connection to Addr, closed at the test's end.
	Conn *grpc.ClientConn
	// Start starts the scheduler (Run), once; Serve calls it unless told
	// not to, so that requests can pile up first.
	Start func()
}

// Serve serves s on a loopback gRPC server made with opts and dials it;
// with start, it starts the scheduler too. At the test's end it closes
// the connection, stops s (starting the scheduler first if nobody did, so
// that Run's shutdown runs), waits for Run to return, and stops the gRPC
// server: cleanups the test registered before Serve run after.
func Serve(t testing.TB, s Server, start bool, opts ...grpc.ServerOption) *Served {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	s.Register(g)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = g.Serve(lis)
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		g.Stop()
		<-served
		t.Fatal(err)
	}
	ran := make(chan struct{})
	started := false
	w := &Served{Addr: lis.Addr().String(), Conn: cc}
	w.Start = func() {
		if started {
			return
		}
		started = true
		go func() {
			defer close(ran)
			if err := s.Run(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	t.Cleanup(func() {
		_ = cc.Close()
		s.Stop()
		w.Start()
		<-ran
		g.Stop()
		<-served
	})
	if start {
		w.Start()
	}
	return w
}

// ServeKVTransfer serves srv as the KV-transfer service of a peer on
// loopback (a fake peer: one that dies mid-pull) until the test ends,
// and returns its address.
func ServeKVTransfer(t testing.TB, srv pdservev1.KVTransferServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pdservev1.RegisterKVTransferServiceServer(g, srv)
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Serve(lis) })
	t.Cleanup(func() { g.Stop(); wg.Wait() })
	return lis.Addr().String()
}

// GoneAddr returns a loopback address nothing listens on (a peer that is
// gone).
func GoneAddr(t testing.TB) string {
	t.Helper()
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	return gone.Addr().String()
}
