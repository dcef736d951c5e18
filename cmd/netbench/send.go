package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
	"github.com/pdserve/pdserve/pkg/kvtransfer"
	"github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"
)

// KV layout: a Llama-3-8B-like layer (8 KV heads × 128 dims × K and V ×
// bf16 = 4 KiB per token and layer) and 32 layers, sent in chunks of 128
// tokens layer by layer, as a chunked prefill hands them out.
const (
	kvLayers     = 32
	kvTokenBytes = 4096
	kvChunk      = 128
)

// result is one line of netbench: one link speed.
type result struct {
	LinkGbps float64 `json:"link_gbps"`
	DelayMs  float64 `json:"delay_ms"` // one-way delay applied (0 where the kernel lacks netem)
	Netem    bool    `json:"netem"`    // whether the delay could be applied
	KVBytes  int64   `json:"kv_bytes"`
	Reps     int     `json:"reps"`

	AdaptiveCodec  string  `json:"adaptive_codec"`
	AdaptiveMs     float64 `json:"adaptive_ms"`
	AdaptiveReason string  `json:"adaptive_reason"`
	BestFixedCodec string  `json:"best_fixed_codec"`
	BestFixedMs    float64 `json:"best_fixed_ms"`
	NoneMs         float64 `json:"none_ms"`
	RawTCPMs       float64 `json:"raw_tcp_ms"`
	// GRPCOverTCP is the throughput of gRPC with codec none over raw TCP
	// on the same link: raw_tcp_ms / none_ms.
	GRPCOverTCP float64 `json:"grpc_over_tcp"`
	// AdaptiveOverBest is adaptive_ms / best_fixed_ms (≤ 1.05 passes).
	AdaptiveOverBest float64 `json:"adaptive_over_best"`
	// NoneOverAdaptive is none_ms / adaptive_ms (≥ 1.3 on the slowest
	// link passes).
	NoneOverAdaptive float64 `json:"none_over_adaptive"`
	// LinkMeasuredGbps is the link throughput the adaptive choice had
	// measured (wire bits/s) when it made its last choice.
	LinkMeasuredGbps float64            `json:"link_measured_gbps"`
	FixedMs          map[string]float64 `json:"fixed_ms"`
	// StreamsMs: the same KV with codec none split by layer over k
	// transfers sent at once (k streams, spread over the Dialer's
	// connections), median ms until every one is acknowledged, per k; and
	// GRPCOverTCPBest = raw_tcp_ms / the fastest of them.
	StreamsMs       map[string]float64 `json:"streams_ms,omitempty"`
	GRPCOverTCPBest float64            `json:"grpc_over_tcp_best,omitempty"`
	// ChunkMs: codec none with the KV handed over in chunks of that many
	// tokens, layer by layer (the per-layer pipelining of a chunked
	// prefill: a frame per layer and chunk, split at 1 MiB), median ms per
	// chunk size, and ChunkFrames the frames each took.
	ChunkMs         map[string]float64 `json:"chunk_ms,omitempty"`
	ChunkFrames     map[string]int     `json:"chunk_frames,omitempty"`
	Ratio           map[string]float64 `json:"ratio"` // raw / wire bytes per codec
	AdaptiveChoices map[string]int     `json:"adaptive_choices"`
}

func sendMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	grpcAddr := fs.String("grpc", "", "decode worker's kvtransfer address")
	rawAddr := fs.String("raw", "", "decode side's raw TCP address")
	gbps := fs.Float64("gbps", 0, "link speed, for the report")
	delay := fs.Duration("delay", 0, "one-way delay applied, for the report")
	kvMiB := fs.Int("kv-mib", 64, "KV per transfer, MiB")
	reps := fs.Int("reps", 3, "timed transfers per codec (the median is reported)")
	recvJSON := fs.String("receiver", "{}", "the decode side's ready line (decode speeds)")
	streams := fs.String("streams", "", "also time codec none split over k concurrent streams, for each k (comma separated; empty: skip)")
	chunks := fs.String("chunks", "", "also time codec none handed over in chunks of these many tokens (comma separated; empty: skip)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var rcv readyLine
	if err := json.Unmarshal([]byte(*recvJSON), &rcv); err != nil {
		return fmt.Errorf("--receiver: %w", err)
	}
	tokens := max(kvChunk, *kvMiB<<20/(kvLayers*kvTokenBytes)/kvChunk*kvChunk)
	kv := makeKV(kvLayers, tokens*kvTokenBytes)
	total := int64(kvLayers * tokens * kvTokenBytes)

	// The prefill worker's chooser, as it runs there: its self-benchmark,
	// the receiver's decode speeds (its heartbeat's, here its ready line)
	// and the link throughput it measures per destination.
	a := kvtransfer.NewCodecChooser(engine.BF16)
	a.SetReceivers(func(string) (kvtransfer.ReceiverSpeeds, bool) {
		return kvtransfer.ReceiverSpeeds{DecodeBytesPerSec: rcv.Decode, Cores: rcv.Cores}, true
	})
	sp, err := a.Speeds()
	if err != nil {
		return err
	}
	d := kvtransfer.NewDialer()
	defer d.Close()
	b := &bench{ctx: ctx, d: d, addr: *grpcAddr, kv: kv, tokens: tokens, chunk: kvChunk}

	res := result{LinkGbps: *gbps, DelayMs: float64(*delay) / 1e6, Netem: *delay > 0, KVBytes: total, Reps: *reps,
		FixedMs: map[string]float64{}, Ratio: map[string]float64{}, AdaptiveChoices: map[string]int{}}

	// Every path gets one warm-up transfer, then reps rounds in which
	// each fixed codec and the adaptive choice send once, interleaved, in
	// an order shuffled every round (seeded: the same every run), so that
	// a slow spell of the shared machine hits them alike and no path
	// always follows the same one. A rotated order kept every path's
	// predecessor fixed: the path after an expensive encode paid for its
	// garbage every round. Each timed transfer also starts after a GC.
	var fixed []string
	for _, s := range sp.Codecs {
		if s.Lossless {
			fixed = append(fixed, s.Codec)
		}
	}
	// The adaptive path's warm-up transfer warms the link measurement up.
	for _, name := range fixed {
		if _, err := b.transfer(name); err != nil {
			return err
		}
	}
	if _, err := b.auto(a, total); err != nil {
		return err
	}
	fms := map[string][]float64{}
	var ams []float64
	paths := append(slices.Clone(fixed), codecpick.Auto)
	for r := range *reps {
		order := rand.New(rand.NewPCG(uint64(r)+1, 0x6f72646572)).Perm(len(paths))
		for _, i := range order {
			name := paths[i]
			runtime.GC()
			if name == codecpick.Auto {
				t, err := b.auto(a, total)
				if err != nil {
					return err
				}
				ams = append(ams, t.ms())
				res.AdaptiveChoices[t.codec]++
				res.AdaptiveCodec, res.AdaptiveReason = t.codec, t.reason
				continue
			}
			t, err := b.transfer(name)
			if err != nil {
				return err
			}
			fms[name] = append(fms[name], t.ms())
			res.Ratio[name] = float64(t.raw) / float64(t.wire)
		}
	}
	for _, name := range fixed {
		res.FixedMs[name] = median(fms[name])
	}
	res.NoneMs = res.FixedMs[codec.None.String()]
	res.BestFixedMs = math.Inf(1)
	for _, name := range fixed {
		if res.FixedMs[name] < res.BestFixedMs {
			res.BestFixedCodec, res.BestFixedMs = name, res.FixedMs[name]
		}
	}
	res.AdaptiveMs = median(ams)
	if link, _ := a.Links().Throughput(*grpcAddr); link > 0 {
		res.LinkMeasuredGbps = round3(link * 8 / 1e9)
	}

	// Raw TCP on the same link, one warm connection.
	rms, err := rawTCP(ctx, *rawAddr, kv, tokens, *reps)
	if err != nil {
		return err
	}
	res.RawTCPMs = rms
	res.GRPCOverTCP = round3(res.RawTCPMs / res.NoneMs)
	if *streams != "" {
		ks, err := intList(*streams)
		if err != nil {
			return fmt.Errorf("--streams: %w", err)
		}
		res.StreamsMs = map[string]float64{}
		best := math.Inf(1)
		for _, k := range ks {
			var ms []float64
			for range *reps + 1 { // the first warms k streams up
				runtime.GC()
				t, err := b.striped(k)
				if err != nil {
					return err
				}
				ms = append(ms, t)
			}
			m := median(ms[1:])
			res.StreamsMs[strconv.Itoa(k)] = round3(m)
			best = min(best, m)
		}
		res.GRPCOverTCPBest = round3(res.RawTCPMs / best)
	}
	if *chunks != "" {
		cs, err := intList(*chunks)
		if err != nil {
			return fmt.Errorf("--chunks: %w", err)
		}
		res.ChunkMs, res.ChunkFrames = map[string]float64{}, map[string]int{}
		for _, c := range cs {
			b.chunk = c
			var ms []float64
			for range *reps {
				runtime.GC()
				t, err := b.transfer(codec.None.String())
				if err != nil {
					return err
				}
				ms = append(ms, t.ms())
			}
			res.ChunkMs[strconv.Itoa(c)] = round3(median(ms))
			res.ChunkFrames[strconv.Itoa(c)] = frames(tokens, c)
		}
		b.chunk = kvChunk
	}
	res.AdaptiveOverBest = round3(res.AdaptiveMs / res.BestFixedMs)
	res.NoneOverAdaptive = round3(res.NoneMs / res.AdaptiveMs)
	for k, v := range res.FixedMs {
		res.FixedMs[k] = round3(v)
	}
	for k, v := range res.Ratio {
		res.Ratio[k] = round3(v)
	}
	res.AdaptiveMs, res.BestFixedMs, res.NoneMs, res.RawTCPMs = round3(res.AdaptiveMs), round3(res.BestFixedMs), round3(res.NoneMs), round3(res.RawTCPMs)
	return printJSON(res)
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// makeKV returns per layer n bytes of bf16 KV: rows of 128 channels, each
// channel Gaussian with its own spread (log-normal, σ of the log 0.75),
// the shape of attention K/V (the same model as codec.SelfBench's
// sample, with other seeds per layer).
func makeKV(layers, n int) [][]byte {
	kv := make([][]byte, layers)
	for l := range kv {
		r := rand.New(rand.NewPCG(uint64(l)+1, 0x6e6574))
		var sigma [128]float64
		for i := range sigma {
			sigma[i] = math.Exp(0.75 * r.NormFloat64())
		}
		out := make([]byte, n)
		for i := 0; i < n/2; i++ {
			f := float32(r.NormFloat64() * sigma[i%128])
			binary.LittleEndian.PutUint16(out[2*i:], bf16(f))
		}
		kv[l] = out
	}
	return kv
}

// bf16 rounds f to bfloat16, nearest, ties to even.
func bf16(f float32) uint16 {
	u := math.Float32bits(f)
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

type bench struct {
	ctx    context.Context
	d      *kvtransfer.Dialer
	addr   string
	kv     [][]byte
	tokens int
	chunk  int // tokens handed over at a time, layer by layer
	seq    int
}

// timed is one transfer.
type timed struct {
	codec, reason string
	d             time.Duration // Open to Ack
	total         time.Duration // from the first Send to the Ack
	encode        time.Duration // spent encoding (Sender.EncodeTime)
	raw, wire     int64
}

func (t timed) ms() float64 { return float64(t.d) / 1e6 }

// transfer sends the whole KV with codec name and waits for the ack.
func (b *bench) transfer(name string) (timed, error) {
	b.seq++
	return b.send(fmt.Sprintf("netbench-%d", b.seq), name, b.kv)
}

// send is one transfer of layers (each b.tokens tokens) as request id with
// codec name, chunk by chunk and layer by layer, until the ack. Safe to
// call concurrently with distinct ids.
func (b *bench) send(id, name string, layers [][]byte) (timed, error) {
	h := kvtransfer.StreamHeader{RequestID: id, Codec: name, Layers: len(layers),
		Tokens: b.tokens, TokenBytes: kvTokenBytes, DType: engine.BF16}
	t0 := time.Now()
	s, err := b.d.Open(b.ctx, b.addr, h)
	if err != nil {
		return timed{}, fmt.Errorf("open %s: %w", name, err)
	}
	sent := time.Now()
	for c := 0; c < b.tokens; c += b.chunk {
		e := min(b.tokens, c+b.chunk)
		for l := range layers {
			if err := s.Send(l, c, e, layers[l][c*kvTokenBytes:e*kvTokenBytes], 0); err != nil {
				s.Abort(err)
				return timed{}, fmt.Errorf("send %s: %w", name, err)
			}
		}
	}
	if _, err := s.Commit(b.ctx, kvtransfer.Commit{}); err != nil {
		return timed{}, fmt.Errorf("commit %s: %w", name, err)
	}
	done := time.Now()
	return timed{codec: name, d: done.Sub(t0), total: done.Sub(sent), encode: s.EncodeTime(), raw: s.BytesRaw(), wire: s.BytesWire()}, nil
}

// striped sends the KV with codec none as k transfers at once, transfer
// i carrying the layers l with l mod k = i, and returns the ms from the
// first Open until the last acknowledgement.
func (b *bench) striped(k int) (float64, error) {
	t0 := time.Now()
	errs := make(chan error, k)
	for i := range k {
		var layers [][]byte
		for l := i; l < len(b.kv); l += k {
			layers = append(layers, b.kv[l])
		}
		b.seq++
		id := fmt.Sprintf("netbench-%d", b.seq)
		go func() {
			_, err := b.send(id, codec.None.String(), layers)
			errs <- err
		}()
	}
	var first error
	for range k {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return float64(time.Since(t0)) / 1e6, first
}

// frames is the number of frames a transfer of tokens in chunks of c
// tokens takes: one per layer and chunk, each split at 1 MiB.
func frames(tokens, c int) int {
	perFrame := max(1, kvtransfer.DefaultMaxFrameBytes/kvTokenBytes)
	n := 0
	for t := 0; t < tokens; t += c {
		n += (min(tokens, t+c) - t + perFrame - 1) / perFrame
	}
	return n * kvLayers
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// auto sends the KV with the codec the chooser picks for it, as the
// prefill worker does for --codec auto, and records the transfer's link
// sample as the worker does: network time from the first Send to the ack
// (the KV is ready, so nothing waits for the engine).
func (b *bench) auto(a *kvtransfer.CodecChooser, raw int64) (timed, error) {
	ch, err := a.Start(b.addr, codecpick.Auto, raw)
	if err != nil {
		return timed{}, err
	}
	t, err := b.transfer(ch.Codec)
	a.Finish(b.addr, ch.Codec, t.raw, t.wire, t.total, t.encode)
	if err != nil {
		return timed{}, err
	}
	t.reason = ch.Reason
	return t, nil
}

// rawTCP writes the KV, chunk by chunk in the order the gRPC path sends
// it, on one TCP connection, reps times after one warm-up, and returns
// the median milliseconds from the first write to the receiver's answer.
func rawTCP(ctx context.Context, addr string, kv [][]byte, tokens, reps int) (float64, error) {
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	total := uint64(len(kv) * tokens * kvTokenBytes)
	one := func() (time.Duration, error) {
		t0 := time.Now()
		var hdr [8]byte
		binary.BigEndian.PutUint64(hdr[:], total)
		if _, err := c.Write(hdr[:]); err != nil {
			return 0, err
		}
		for ch := 0; ch < tokens; ch += kvChunk {
			e := min(tokens, ch+kvChunk)
			for l := range kv {
				if _, err := c.Write(kv[l][ch*kvTokenBytes : e*kvTokenBytes]); err != nil {
					return 0, err
				}
			}
		}
		if _, err := io.ReadFull(c, hdr[:1]); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
	if _, err := one(); err != nil {
		return 0, fmt.Errorf("raw tcp: %w", err)
	}
	var ms []float64
	for range reps {
		d, err := one()
		if err != nil {
			return 0, fmt.Errorf("raw tcp: %w", err)
		}
		ms = append(ms, float64(d)/1e6)
	}
	return median(ms), nil
}
