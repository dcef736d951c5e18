package kvtransfer

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// benchShape is one request's KV on a Llama-3-8B-like layout (8 KV heads ×
// 128 dims × K and V × bf16 = 4 KiB per token and layer), cut to 8 layers
// of 512 tokens (16 MiB) to keep the benchmark short. Chunks of 128 tokens
// (512 KiB per layer) are sent layer by layer, as a chunked prefill does.
var benchShape = StreamHeader{RequestID: "bench-0123456789abcdef", Layers: 8, Tokens: 512, TokenBytes: 4096, DType: engine.BF16}

const benchChunk = 128

// benchSink copies the KV it receives into one preallocated buffer per
// layer, like an engine's ImportKV. It is reused by consecutive transfers.
type benchSink struct {
	h   StreamHeader
	dst [][]byte
}

func (s *benchSink) Begin(_ context.Context, h StreamHeader) (Sink, error) { return s, nil }

func (s *benchSink) Write(layer, start, _ int, raw []byte) error {
	copy(s.dst[layer][start*s.h.TokenBytes:], raw)
	return nil
}
func (s *benchSink) Commit(Commit) error { return nil }
func (s *benchSink) Abort(error)         {}

func newBenchSink(h StreamHeader) *benchSink {
	s := &benchSink{h: h, dst: make([][]byte, h.Layers)}
	for l := range s.dst {
		s.dst[l] = make([]byte, h.Tokens*h.TokenBytes)
	}
	return s
}

// BenchmarkTransfer measures one request's KV moved over loopback: raw-tcp
// writes the same bytes, chunk by chunk, on one TCP connection to a reader
// that reads them into place and answers one byte; grpc/<codec> runs the
// full path (encode, frame, gRPC stream, bounds checks, decode, copy into
// place, commit and ack). Bytes are the raw KV bytes, so MB/s compare
// directly; the ratio grpc/none ÷ raw-tcp is the transport's efficiency.
func BenchmarkTransfer(b *testing.B) {
	h := benchShape
	kv := make([][]byte, h.Layers)
	for l := range kv {
		kv[l] = gaussianBF16(h.Tokens*h.TokenBytes/2, uint64(l)+11)
	}
	total := h.Layers * h.Tokens * h.TokenBytes

	b.Run("raw-tcp", func(b *testing.B) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer lis.Close()
		sink := newBenchSink(h)
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			for {
				for c := 0; c < h.Tokens; c += benchChunk {
					e := min(h.Tokens, c+benchChunk)
					for l := range sink.dst {
						if _, err := io.ReadFull(conn, sink.dst[l][c*h.TokenBytes:e*h.TokenBytes]); err != nil {
							return
						}
					}
				}
				if _, err := conn.Write([]byte{1}); err != nil {
					return
				}
			}
		})
		conn, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		ack := make([]byte, 1)
		b.SetBytes(int64(total))
		b.ResetTimer()
		for b.Loop() {
			for c := 0; c < h.Tokens; c += benchChunk {
				e := min(h.Tokens, c+benchChunk)
				for l := range kv {
					if _, err := conn.Write(kv[l][c*h.TokenBytes : e*h.TokenBytes]); err != nil {
						b.Fatal(err)
					}
				}
			}
			if _, err := io.ReadFull(conn, ack); err != nil {
				b.Fatal(err)
			}
		}
	})

	for _, c := range codec.All() {
		b.Run("grpc/"+c.Name(), func(b *testing.B) {
			addr := startServer(b, newBenchSink(h), nil)
			d := NewDialer()
			defer d.Close()
			hc := h
			hc.Codec = c.Name()
			var wire int64
			b.SetBytes(int64(total))
			b.ResetTimer()
			for b.Loop() {
				s, err := d.Open(context.Background(), addr, hc)
				if err != nil {
					b.Fatal(err)
				}
				if err := sendAll(s, kv, benchChunk); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Commit(context.Background(), Commit{}); err != nil {
					b.Fatal(err)
				}
				wire = s.BytesWire()
			}
			b.ReportMetric(float64(total)/float64(wire), "ratio")
		})
	}
}
