package workerrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
)

// BenchmarkRequest measures one request end to end over loopback gRPC on
// the tiny reference model (64 prompt tokens, 16 output tokens, one request
// at a time): disaggregated (Reserve, Prefill and Generate on two workers,
// KV over kvtransfer) against colocated (Generate with local prefill).
// Compare the two in one run; absolute figures depend on the machine.
func BenchmarkRequest(b *testing.B) {
	const promptTokens, outTokens = 64, 16
	p := prompt(promptTokens, 1)
	start := func(b *testing.B, role control.Role) (*Worker, *grpc.ClientConn) {
		o := testOptions(role, "")
		o.MetricsAddr = ""
		o.Engine.Threads = 0
		w, err := Start(context.Background(), o, zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		cc, err := grpc.NewClient(w.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = cc.Close()
			_ = w.Stop(context.Background())
		})
		return w, cc
	}
	drain := func(s grpc.ServerStreamingClient[pdservev1.GenerateResponse]) error {
		for {
			if _, err := s.Recv(); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return err
			}
		}
	}
	b.Run("disaggregated", func(b *testing.B) {
		_, pcc := start(b, control.RolePrefill)
		dw, dcc := start(b, control.RoleDecode)
		pc, dc := pdservev1.NewPrefillServiceClient(pcc), pdservev1.NewDecodeServiceClient(dcc)
		ctx := context.Background()
		i := 0
		for b.Loop() {
			id := fmt.Sprint("d", i)
			i++
			if _, err := dc.Reserve(ctx, &pdservev1.ReserveRequest{RequestId: id, Tokens: promptTokens + outTokens}); err != nil {
				b.Fatal(err)
			}
			gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: id, PromptTokens: p, MaxTokens: outTokens, IgnoreEos: true})
			if err != nil {
				b.Fatal(err)
			}
			pre, err := pc.Prefill(ctx, &pdservev1.PrefillRequest{RequestId: id, PromptTokens: p, DecodeAddr: dw.Addr(), Codec: "none"})
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := readPrefill(pre); err != nil {
				b.Fatal(err)
			}
			if err := drain(gen); err != nil {
				b.Fatal(err)
			}
			if _, err := pc.Release(ctx, &pdservev1.ReleaseRequest{RequestId: id}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("colocated", func(b *testing.B) {
		_, cc := start(b, control.RoleColocated)
		dc := pdservev1.NewDecodeServiceClient(cc)
		ctx := context.Background()
		i := 0
		for b.Loop() {
			gen, err := dc.Generate(ctx, &pdservev1.GenerateRequest{RequestId: fmt.Sprint("c", i), PromptTokens: p, MaxTokens: outTokens, IgnoreEos: true, LocalPrefill: true})
			i++
			if err != nil {
				b.Fatal(err)
			}
			if err := drain(gen); err != nil {
				b.Fatal(err)
			}
		}
	})
}
