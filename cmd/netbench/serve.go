package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"io"
	"net"
	"runtime"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
)

// maxKVBytes bounds what the receiver accepts in one transfer (both
// paths), as a decode worker's reservation would.
const maxKVBytes = 1 << 30

// readyLine is what serve prints once it listens: the decode speeds per
// core its self-benchmark measured, as a decode worker's heartbeat
// carries them to the prefill workers.
type readyLine struct {
	Ready  bool               `json:"ready"`
	Decode map[string]float64 `json:"decode_bytes_per_s"`
	Cores  int                `json:"cores"`
}

// serveMain runs the decode side: a kvtransfer server whose sink copies
// the KV into place (as an engine's ImportKV does), and a raw TCP
// listener that reads the same bytes into place and answers one byte.
func serveMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	grpcAddr := fs.String("grpc", "", "kvtransfer listen address (inside the decode namespace)")
	rawAddr := fs.String("raw", "", "raw TCP listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sp, err := codec.SelfBench(ctx, engine.BF16, codec.DefaultBenchBudget)
	if err != nil {
		return err
	}
	ready := readyLine{Ready: true, Decode: map[string]float64{}, Cores: runtime.GOMAXPROCS(0)}
	for _, s := range sp.Codecs {
		ready.Decode[s.Codec] = s.DecodeBytesPerSec
	}
	glis, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		return err
	}
	rlis, err := net.Listen("tcp", *rawAddr)
	if err != nil {
		glis.Close()
		return err
	}
	srv := grpc.NewServer(kvtransfer.GRPCServerOptions()...)
	kvtransfer.Register(srv, &placeReceiver{}, engine.BF16)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(glis) })
	wg.Go(func() { serveRaw(rlis) })
	if err := printJSON(ready); err != nil {
		return err
	}
	<-ctx.Done()
	srv.Stop()
	rlis.Close()
	wg.Wait()
	return nil
}

// placeReceiver accepts every transfer into per-layer buffers, reused
// from one transfer to the next. Transfers come one at a time; a second
// one at once gets its own buffers.
type placeReceiver struct {
	mu   sync.Mutex
	free [][]byte // per-layer buffers of the last transfer
}

func (r *placeReceiver) Begin(_ context.Context, h kvtransfer.StreamHeader) (kvtransfer.Sink, error) {
	if int64(h.Layers)*int64(h.Tokens)*int64(h.TokenBytes) > maxKVBytes {
		return nil, status.Errorf(codes.ResourceExhausted, "netbench: %d layers × %d tokens × %d bytes exceed %d", h.Layers, h.Tokens, h.TokenBytes, maxKVBytes)
	}
	r.mu.Lock()
	bufs := r.free
	r.free = nil
	r.mu.Unlock()
	n := h.Tokens * h.TokenBytes
	if len(bufs) != h.Layers || len(bufs[0]) != n {
		bufs = make([][]byte, h.Layers)
		for l := range bufs {
			bufs[l] = make([]byte, n)
		}
	}
	return &placeSink{r: r, h: h, dst: bufs}, nil
}

type placeSink struct {
	r   *placeReceiver
	h   kvtransfer.StreamHeader
	dst [][]byte
}

func (s *placeSink) Write(layer, start, _ int, raw []byte) error {
	copy(s.dst[layer][start*s.h.TokenBytes:], raw)
	return nil
}

func (s *placeSink) Commit(kvtransfer.Commit) error { s.release(); return nil }
func (s *placeSink) Abort(error)                    { s.release() }

func (s *placeSink) release() {
	s.r.mu.Lock()
	s.r.free = s.dst
	s.r.mu.Unlock()
}

// serveRaw answers raw TCP transfers: an 8-byte big-endian length n ≤
// maxKVBytes, then n bytes read into one buffer, answered with one byte;
// repeated until the sender closes.
func serveRaw(lis net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer c.Close()
			var buf []byte
			var hdr [8]byte
			for {
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					return
				}
				n := binary.BigEndian.Uint64(hdr[:])
				if n > maxKVBytes {
					return
				}
				if uint64(len(buf)) < n {
					buf = make([]byte, n)
				}
				if _, err := io.ReadFull(c, buf[:n]); err != nil {
					return
				}
				if _, err := c.Write([]byte{1}); err != nil {
					return
				}
			}
		})
	}
}

// errSkip: network namespaces are not allowed here.
var errSkip = errors.New("network namespaces not allowed")
