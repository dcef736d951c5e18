package adversarial

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/decode"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/engine/ref"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/wire"
)

// trickle opens a connection to addr that sends the headers of a
// 1000-byte completion body and then one byte every 100 ms, never all of
// it; it returns the connection.
func trickle(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", frontend.RouteCompletions)
	go func() {
		for {
			time.Sleep(100 * time.Millisecond)
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	return c
}

// TestTrickledBodies: with --max-admitted-requests 2, two bodies trickled within
// the idle timeout hold both slots only until the body deadline; then
// they get 408 and everyone else is served again (before: 429 for as
// long as the trickles lasted).
func TestTrickledBodies(t *testing.T) {
	d := start(t, nil, func(o *coordinator.Options) {
		o.HTTPBodyTimeout = time.Second
		o.PolicyEdits = append(o.PolicyEdits, func(p *config.Policy) { p.Limits.QueueLimit = 2 })
	})
	var conns []net.Conn
	for range 2 {
		conns = append(conns, trickle(t, d.HTTPAddr()))
	}
	time.Sleep(200 * time.Millisecond) // both admitted
	if r := d.post(t, frontend.RouteCompletions, "", strings.NewReader(`{"prompt":"a","max_tokens":1}`)); r.status != 429 {
		t.Errorf("while two trickles hold the slots: status %d, want 429", r.status)
	}
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		if !strings.Contains(string(buf[:n]), " 408 ") {
			t.Errorf("trickled body: %q, want 408", buf[:n])
		}
	}
	poll.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if r := d.post(t, frontend.RouteCompletions, "", strings.NewReader(`{"prompt":"a","max_tokens":1}`)); r.status != 200 {
			return fmt.Errorf("status %d", r.status)
		}
		return nil
	})
}

// TestStalledHTTPClient: clients that stop reading their streams (n=16
// × 1000 tokens with 20 logprobs) are cancelled after the write timeout,
// counted, and the decode worker frees their KV; the heap stays bounded
// meanwhile (before: +50 MB per stream, held until the client left).
func TestStalledHTTPClient(t *testing.T) {
	d := start(t, nil, func(o *coordinator.Options) { o.HTTPWriteTimeout = 500 * time.Millisecond })
	body := `{"prompt":"a","max_tokens":1000,"n":16,"logprobs":20,"ignore_eos":true,"stream":true,"temperature":1}`
	const k = 2
	peak := heapPeak(func() {
		for range k {
			// A small receive buffer and segment size, set before the
			// connection exists, so that from the handshake on the
			// server's writes block after kilobytes, however fast it
			// generates. Before, only the receive buffer was set, after
			// connecting: loopback's 64 KiB segments let the server's send
			// buffer grow to megabytes, which a loaded machine took longer
			// than the poll to generate (0 streams cancelled in 120 s).
			dialer := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
					if serr == nil {
						serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 536)
					}
				}); err != nil {
					return err
				}
				return serr
			}}
			c, err := dialer.Dial("tcp", d.HTTPAddr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", frontend.RouteCompletions, len(body), body)
			// never read
		}
		poll.CheckFor(t, 120*time.Second, 50*time.Millisecond, func() error {
			if n := counter(t, d.Registry(), "pdserve_stream_stalled_cancels_total"); n != k {
				return fmt.Errorf("%v stalled streams cancelled, want %d", n, k)
			}
			return nil
		})
	})
	poll.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		free, total := gauge(t, d.Registry(), "pdserve_kv_blocks_free"), gauge(t, d.Registry(), "pdserve_kv_blocks_capacity")
		if running := gauge(t, d.Registry(), "pdserve_decode_running"); free != total || running != 0 {
			return fmt.Errorf("decode worker: %v running, %v of %v blocks free", running, free, total)
		}
		return nil
	})
	t.Logf("%d stalled streams: heap peak +%d MiB", k, peak>>20)
	if bound := uint64(64 << 20); peak > bound {
		t.Errorf("heap grew by %d MiB with %d stalled streams, over %d MiB", peak>>20, k, bound>>20)
	}
}

// TestStalledGRPCCaller: a gRPC caller that calls Generate (n=16 × 1000
// tokens, 20 logprobs) and never reads is cancelled by the decode
// worker's outbox bound (1 MiB here), its KV and output freed, the heap
// bounded (about 21 MB of output unbounded).
func TestStalledGRPCCaller(t *testing.T) {
	eng, err := ref.New(ref.Options{Preset: "tiny", Seed: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	o := decode.DefaultOptions()
	o.MaxBatch, o.KVBlocks = 16, 2048
	o.MaxOutboxBytes = 1 << 20 // unbounded, the output would reach 21 MB
	reg := prometheus.NewRegistry()
	s, err := decode.New(eng, o, zaptest.NewLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(kvtransfer.GRPCServerOptions()...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()
	defer s.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// The live heap (after a collection) at each poll: garbage between
	// collections would hide what the request holds.
	runtime.GC()
	base := heapObjects()
	var peak uint64
	if _, err := pdservev1.NewDecodeServiceClient(cc).Generate(ctx, &pdservev1.GenerateRequest{
		RequestId: "stalled", PromptTokens: []int32{1, 2, 3, 4}, MaxTokens: 1000, LocalPrefill: true, IgnoreEos: true, N: 16,
		Sampling: wire.Sampling(engine.Sampling{Temperature: 1, Seed: 3}), Logprobs: wire.Logprobs(engine.MaxTopLogprobs),
	}); err != nil {
		t.Fatal(err)
	}
	poll.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		runtime.GC()
		if h := heapObjects(); h > base && h-base > peak {
			peak = h - base
		}
		if n := counter(t, reg, "pdserve_decode_stream_stalled_cancels_total"); n != 1 {
			return fmt.Errorf("%v cancelled, want 1", n)
		}
		if st := s.Stats(); st.Requests != 0 || st.KVBlocksFree != st.KVBlocksTotal {
			return fmt.Errorf("%d requests, %d of %d blocks free", st.Requests, st.KVBlocksFree, st.KVBlocksTotal)
		}
		return nil
	})
	t.Logf("a stalled gRPC caller: live heap peak +%d KiB", peak>>10)
	if bound := uint64(8 << 20); peak > bound {
		t.Errorf("live heap grew by %d MiB, over %d MiB", peak>>20, bound>>20)
	}
}
