package adversarial

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/decode"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// TestGRPCRefusalsAllLogged: a decode worker requiring the coordinator's
// token, with the binaries' logger, refuses a burst of 500 Reserve calls
// (250 without a token, 250 with a wrong one) and logs 500 "grpc call
// refused" lines (sampled before: 119 of 2000).
func TestGRPCRefusalsAllLogged(t *testing.T) {
	log, count := binaryLogger(t)
	sum := sha256.Sum256([]byte("the-coordinator-token-0123456789"))
	tokenFile := filepath.Join(t.TempDir(), "coordinator.sha256")
	if err := os.WriteFile(tokenFile, []byte("sha256:"+hex.EncodeToString(sum[:])), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := grpcauth.Options{TokenFile: tokenFile}.Load(0, log)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	s, err := decode.New(eng, decode.DefaultOptions(), zaptest.NewLogger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append(kvtransfer.GRPCServerOptions(), auth.ServerOptions()...)...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := pdservev1.NewDecodeServiceClient(cc)
	before := count("grpc call refused")
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	for i := range 500 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx := context.Background()
			if i%2 == 1 {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer not-the-token-0123456789abcdef")
			}
			_, err := client.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "r", Tokens: 3, Sequences: 1, PromptTokens: 2, Prompt: []int32{1, 2}})
			mu.Lock()
			codesSeen[status.Code(err)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codesSeen[codes.Unauthenticated] != 500 {
		t.Errorf("status codes %v, want 500 Unauthenticated", codesSeen)
	}
	if got := count("grpc call refused") - before; got != 500 {
		t.Errorf("%d \"grpc call refused\" lines for 500 refused calls", got)
	}
}
