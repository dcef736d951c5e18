package kvtransfer

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/kv/codec"
)

// The fuzz target's model: what its receiver accepts.
const (
	fuzzID         = "fz"
	fuzzLayers     = 2
	fuzzTokenBytes = 8
	fuzzReserved   = 64   // tokens the one reservation holds
	fuzzMaxFrame   = 4096 // the server's max frame bytes
)

// fuzzInput encodes a Push stream for FuzzPushStream: per message a
// control byte (bit 0: deliver the message in pieces of 1 + ctl>>1 bytes,
// as HTTP/2 data frames may), a little-endian uint16 length and the
// message's bytes.
func fuzzInput(ctl byte, msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = append(out, ctl)
		out = binary.LittleEndian.AppendUint16(out, uint16(len(m)))
		out = append(out, m...)
	}
	return out
}

// parseFuzzInput is fuzzInput's inverse; a short tail is one last
// message.
func parseFuzzInput(data []byte) (msgs [][]byte, pieces []int) {
	for len(data) > 0 {
		ctl := data[0]
		data = data[1:]
		n := len(data)
		if len(data) >= 2 {
			n = min(int(binary.LittleEndian.Uint16(data)), len(data)-2)
			data = data[2:]
		}
		msgs = append(msgs, data[:n])
		data = data[n:]
		p := 0 // one piece
		if ctl&1 != 0 {
			p = 1 + int(ctl>>1)
		}
		pieces = append(pieces, p)
	}
	return msgs, pieces
}

func mustMarshal(tb testing.TB, m *pdservev1.PushRequest) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// fuzzTransfer returns the messages of a valid transfer of tokens tokens
// with codecName, in chunks of chunk tokens, every frame as the wire
// codec sends it.
func fuzzTransfer(tb testing.TB, codecName string, tokens, chunk int) [][]byte {
	c, err := codec.ByName(codecName)
	if err != nil {
		tb.Fatal(err)
	}
	h := StreamHeader{RequestID: fuzzID, Codec: c.Name(), Layers: fuzzLayers, Tokens: tokens, TokenBytes: fuzzTokenBytes}
	msgs := [][]byte{mustMarshal(tb, headerMsg(h))}
	for s := 0; s < tokens; s += chunk {
		e := min(tokens, s+chunk)
		for l := range fuzzLayers {
			raw := gaussianBF16((e-s)*fuzzTokenBytes/2, uint64(l*100+s))
			f, err := codec.AppendFrame(nil, codec.Header{RequestID: fuzzID, Layer: uint32(l), Start: uint32(s), End: uint32(e), DType: engine.BF16}, c, raw)
			if err != nil {
				tb.Fatal(err)
			}
			msgs = append(msgs, wireMsg(f))
		}
	}
	return append(msgs, mustMarshal(tb, commitMsg(7)))
}

// FuzzPushStream feeds arbitrary message sequences, as they arrive from
// the network, through the server's Push handler, over the wire codec
// (fast) or the proto codec, against a receiver that checks the Sink
// contract. Whatever arrives: no panic, every begun sink ends exactly once
// and holds nothing afterwards, no more KV than reserved is written,
// every received buffer is freed, and a refusal is a clean status.
func FuzzPushStream(f *testing.F) {
	for _, name := range []string{"none", "s2", "zstd", "fp8", "int8"} {
		f.Add(true, fuzzInput(0, fuzzTransfer(f, name, 37, 16)...))
	}
	f.Add(false, fuzzInput(0, fuzzTransfer(f, "zstd", 20, 8)...))
	f.Add(true, fuzzInput(7, fuzzTransfer(f, "none", 5, 5)...)) // in 4-byte pieces
	f.Fuzz(func(t *testing.T, fast bool, data []byte) { _ = pushFuzz(t, fast, data) })
}

// pushFuzz runs one fuzz input through the server, checks what it must,
// and returns the server's error.
func pushFuzz(t *testing.T, fast bool, data []byte) error {
	msgs, pieces := parseFuzzInput(data)
	r := &fuzzReceiver{}
	sv := &server{r: r, dtype: engine.BF16, o: newServerOptions([]ServerOption{WithMaxFrameBytes(fuzzMaxFrame)})}
	ctx := context.Background()
	if fast { // the content type selects the wire codec (usesWireCodec)
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("content-type", "application/grpc+"+CodecName))
	}
	st := &fuzzStream{ctx: ctx, msgs: msgs, pieces: pieces}
	err := sv.Push(st)
	if st.got != st.freed.Load() {
		t.Errorf("%d received buffers, %d freed", st.got, st.freed.Load())
	}
	if err := r.check(); err != nil {
		t.Error(err)
	}
	committed := r.committed()
	switch code := status.Code(err); {
	case err == nil:
		if st.resp == nil || committed != 1 {
			t.Errorf("Push succeeded with response %v and %d commits", st.resp, committed)
		}
	case committed != 0:
		t.Errorf("Push failed (%v) after a commit", err)
	case code == codes.InvalidArgument, code == codes.FailedPrecondition, code == codes.ResourceExhausted:
	case code == codes.Internal && strings.Contains(err.Error(), "failed to unmarshal"):
		// A message that is not a PushRequest: gRPC's own status.
	default:
		t.Errorf("Push: unexpected %v", err)
	}
	return err
}

// The fuzz target's seeds are valid transfers, which commit; damaged ones
// fail cleanly.
func TestPushFuzzSeeds(t *testing.T) {
	valid := fuzzTransfer(t, "s2", 37, 16)
	for _, tc := range []struct {
		name string
		fast bool
		data []byte
		want codes.Code
	}{
		{"valid", true, fuzzInput(0, valid...), codes.OK},
		{"valid over proto", false, fuzzInput(0, valid...), codes.OK},
		{"valid in pieces", true, fuzzInput(9, valid...), codes.OK},
		{"no commit", true, fuzzInput(0, valid[:len(valid)-1]...), codes.InvalidArgument},
		{"early commit", true, fuzzInput(0, valid[0], valid[len(valid)-1]), codes.InvalidArgument},
		{"frame twice", true, fuzzInput(0, append([][]byte{valid[0], valid[1]}, valid[1:]...)...), codes.InvalidArgument},
		{"not protobuf", true, fuzzInput(0, valid[0], []byte{0xff, 0xff, 0xff}), codes.Internal},
		{"too many layers", true, fuzzInput(0, mustMarshal(t, headerMsg(StreamHeader{RequestID: fuzzID, Codec: "none", Layers: 1<<31 - 1, Tokens: 1, TokenBytes: 8}))), codes.InvalidArgument},
		{"over the reservation", true, fuzzInput(0, fuzzTransfer(t, "none", fuzzReserved+1, 8)...), codes.ResourceExhausted},
		{"empty", true, nil, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(pushFuzz(t, tc.fast, tc.data)); got != tc.want {
				t.Errorf("Push: %v, want %v", got, tc.want)
			}
		})
	}
}

// fuzzStream is a Push call's server stream fed from a fuzz input. Every
// message arrives in buffers of a counting pool, which gRPC would free
// after the codec's Unmarshal; the codec may keep a reference of its own.
type fuzzStream struct {
	ctx    context.Context
	msgs   [][]byte
	pieces []int
	next   int
	resp   *pdservev1.PushResponse

	got   int32        // pooled buffers handed out
	freed atomic.Int32 // and returned to the pool
}

func (s *fuzzStream) Put(b *[]byte) { s.freed.Add(1) }
func (s *fuzzStream) Get(n int) *[]byte {
	b := make([]byte, n)
	return &b
}

var _ mem.BufferPool = (*fuzzStream)(nil)

// data returns message m's bytes as gRPC hands them to a codec.
func (s *fuzzStream) data(m []byte, piece int) mem.BufferSlice {
	if piece <= 0 {
		piece = max(len(m), 1)
	}
	var out mem.BufferSlice
	for len(m) > 0 {
		k := min(piece, len(m))
		b := make([]byte, k, max(k, 4096)) // pooled whatever its length
		copy(b, m[:k])
		out = append(out, mem.NewBuffer(&b, s))
		s.got++
		m = m[k:]
	}
	return out
}

func (s *fuzzStream) recv(v any) error {
	if s.next >= len(s.msgs) {
		return io.EOF
	}
	m, p := s.msgs[s.next], s.pieces[s.next]
	s.next++
	data := s.data(m, p)
	defer data.Free()
	var err error
	if in, ok := v.(*inMsg); ok {
		err = wireCodec{}.Unmarshal(data, in)
	} else {
		err = protoCodec.Unmarshal(data, v)
	}
	if err != nil {
		// What gRPC's receive path makes of a codec error.
		return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
	return nil
}

func (s *fuzzStream) RecvMsg(m any) error { return s.recv(m) }
func (s *fuzzStream) Recv() (*pdservev1.PushRequest, error) {
	m := new(pdservev1.PushRequest)
	if err := s.recv(m); err != nil {
		return nil, err
	}
	return m, nil
}
func (s *fuzzStream) SendAndClose(r *pdservev1.PushResponse) error {
	s.resp = r
	return nil
}
func (s *fuzzStream) SetHeader(metadata.MD) error  { return nil }
func (s *fuzzStream) SendHeader(metadata.MD) error { return nil }
func (s *fuzzStream) SetTrailer(metadata.MD)       {}
func (s *fuzzStream) Context() context.Context     { return s.ctx }
func (s *fuzzStream) SendMsg(any) error            { return nil }

// fuzzReceiver accepts a transfer of request fuzzID of the fuzz model's
// shape within the reservation, as the decode worker's receiver does, and
// checks every Sink call against the contract.
type fuzzReceiver struct {
	mu    sync.Mutex
	sinks []*fuzzSink
}

func (r *fuzzReceiver) Begin(_ context.Context, h StreamHeader) (Sink, error) {
	switch {
	case h.RequestID != fuzzID:
		return nil, status.Errorf(codes.FailedPrecondition, "no reservation for %q", h.RequestID)
	case h.Tokens > fuzzReserved:
		return nil, status.Errorf(codes.ResourceExhausted, "%d tokens, %d reserved", h.Tokens, fuzzReserved)
	case h.Layers != fuzzLayers || h.TokenBytes != fuzzTokenBytes:
		return nil, status.Errorf(codes.InvalidArgument, "shape %d×%d", h.Layers, h.TokenBytes)
	}
	s := &fuzzSink{h: h, have: make([]int, h.Layers)}
	r.mu.Lock()
	r.sinks = append(r.sinks, s)
	r.mu.Unlock()
	return s, nil
}

func (r *fuzzReceiver) check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sinks) > 1 {
		return fmt.Errorf("%d sinks for one stream", len(r.sinks))
	}
	for _, s := range r.sinks {
		switch {
		case s.violation != nil:
			return s.violation
		case s.commits+s.aborts != 1:
			return fmt.Errorf("sink ended %d times (%d commits, %d aborts)", s.commits+s.aborts, s.commits, s.aborts)
		case s.held != 0:
			return fmt.Errorf("sink holds %d bytes after its end", s.held)
		}
	}
	return nil
}

func (r *fuzzReceiver) committed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.sinks {
		n += s.commits
	}
	return n
}

// fuzzSink stages what it is written, as the decode worker does, and
// frees it at the end.
type fuzzSink struct {
	h               StreamHeader
	have            []int // per layer: tokens written
	held            int   // bytes staged
	commits, aborts int
	violation       error
}

func (s *fuzzSink) violate(format string, a ...any) {
	if s.violation == nil {
		s.violation = fmt.Errorf(format, a...)
	}
}

func (s *fuzzSink) Write(layer, start, end int, raw []byte) error {
	switch {
	case s.commits+s.aborts > 0:
		s.violate("write after the end")
	case layer < 0 || layer >= s.h.Layers || start != s.have[layer] || end <= start || end > s.h.Tokens:
		s.violate("write layer %d [%d,%d) out of bounds or order (have %v of %d)", layer, start, end, s.have, s.h.Tokens)
	case len(raw) != (end-start)*s.h.TokenBytes:
		s.violate("write of %d bytes for [%d,%d)", len(raw), start, end)
	default:
		s.have[layer] = end
		s.held += len(raw)
	}
	return nil
}

func (s *fuzzSink) Commit(Commit) error {
	if s.commits+s.aborts > 0 {
		s.violate("commit after the end")
	}
	for l, n := range s.have {
		if n != s.h.Tokens {
			s.violate("commit with layer %d holding %d of %d tokens", l, n, s.h.Tokens)
		}
	}
	s.commits++
	s.held = 0 // handed to the engine
	return nil
}

func (s *fuzzSink) Abort(error) {
	if s.commits > 0 {
		s.violate("abort after commit")
	}
	s.aborts++
	s.held = 0
}
