package coordinator_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/grpcauth"
)

// reserveOn calls Reserve on the decode worker at addr with opts and
// returns the code.
func reserveOn(t *testing.T, addr string, opts ...grpc.DialOption) codes.Code {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc := pdservev1.NewDecodeServiceClient(cc)
	_, err = dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: "outsider", Tokens: 4})
	if err == nil {
		_, _ = dc.Cancel(ctx, &pdservev1.CancelRequest{RequestId: "outsider"})
	}
	return status.Code(err)
}

// The coordinator sends its token to the workers: with --grpc-token-file,
// and in standalone mode without one (tokens generated at start, shared
// in memory), requests are served while a caller without the token is
// refused by the workers.
func TestWorkersServeOnlyTheCoordinatorsToken(t *testing.T) {
	const token = "a-coordinator-token-for-this-test-000"
	file := filepath.Join(t.TempDir(), "grpc.token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		auth grpcauth.Options
	}{
		{"generated tokens", grpcauth.Options{}},
		{"token file", grpcauth.Options{TokenFile: file}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, clusterOpts{edit: func(o *coordinator.Options) { o.GRPCAuth = tc.auth }})
			if r := complete(context.Background(), t, cl.url, request{Prompt: "hello there", MaxTokens: 3, IgnoreEOS: true}); len(r.Tokens) != 3 {
				t.Errorf("%d tokens, want 3", len(r.Tokens))
			}
			var decode string
			for _, w := range cl.c.Workers() {
				if w.Role() == control.RoleDecode {
					decode = w.Addr()
				}
			}
			if got := reserveOn(t, decode); got != codes.Unauthenticated {
				t.Errorf("Reserve without a token: %v, want UNAUTHENTICATED", got)
			}
			if tc.auth.TokenFile != "" {
				a, err := tc.auth.Load(grpcauth.RoleCoordinator, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := reserveOn(t, decode, a.DialOptions()...); got != codes.OK {
					t.Errorf("Reserve with the token: %v, want OK", got)
				}
			}
		})
	}
}
