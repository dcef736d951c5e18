package kvtransfer

import (
	"bytes"
	"encoding/binary"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// countingPool is a mem.BufferPool that counts Puts.
type countingPool struct {
	sizedPool
	puts atomic.Int32
}

func (p *countingPool) Put(b *[]byte) {
	p.puts.Add(1)
	p.sizedPool.Put(b)
}

// wireMsg returns the bytes of a frame message: prefix and frame.
func wireMsg(frame []byte) []byte {
	out := []byte{frameTag}
	out = binary.AppendUvarint(out, uint64(len(frame)))
	return append(out, frame...)
}

// split cuts b into buffers of at most n bytes.
func split(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		s = append(s, mem.SliceBuffer(b[:k]))
		b = b[k:]
	}
	return s
}

func TestWireCodecRegistered(t *testing.T) {
	if c := encoding.GetCodecV2(CodecName); c == nil || c.Name() != CodecName {
		t.Fatalf("codec %q not registered: %v", CodecName, c)
	}
}

func TestWireCodecFrameIsProtobuf(t *testing.T) {
	// The bytes the codec sends for a frame are the protobuf encoding of a
	// PushRequest carrying that frame, for short and long frames (one- and
	// multi-byte lengths).
	for _, n := range []int{0, 1, 127, 128, 20000, 1 << 20} {
		frame := bytes.Repeat([]byte{0xab}, n)
		want, err := proto.Marshal(frameMsg(frame))
		if err != nil {
			t.Fatal(err)
		}
		if got := wireMsg(frame); !bytes.Equal(got, want) {
			t.Errorf("frame of %d bytes: prefix %x, protobuf %x", n, got[:min(8, len(got))], want[:min(8, len(want))])
		}
	}
}

func TestWireCodecMarshal(t *testing.T) {
	pool := &countingPool{}
	bp := pool.Get(4096)
	copy(*bp, "payload")
	f := &outFrame{buf: mem.NewBuffer(bp, pool)}
	got, err := wireCodec{}.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || &got[0].ReadOnlyData()[0] != &(*bp)[0] {
		t.Fatal("Marshal copied the frame buffer")
	}
	if _, err := (wireCodec{}).Marshal(f); err == nil {
		t.Error("second Marshal of one frame = nil error")
	}
	got.Free() // what gRPC does once written
	if pool.puts.Load() != 1 {
		t.Errorf("buffer returned to the pool %d times, want 1", pool.puts.Load())
	}

	// Protobuf messages go to the proto codec.
	req := headerMsg(testShape)
	data, err := wireCodec{}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	want, _ := proto.Marshal(req)
	if !bytes.Equal(data.Materialize(), want) {
		t.Error("protobuf message not marshaled as protobuf")
	}
	if _, err := (wireCodec{}).Marshal(42); err == nil {
		t.Error("Marshal(42) = nil error")
	}
}

func TestWireCodecUnmarshal(t *testing.T) {
	frame := gaussianBF16(3000, 9)
	msg := wireMsg(frame)

	t.Run("one buffer is kept, not copied", func(t *testing.T) {
		pool := &countingPool{}
		bp := pool.Get(len(msg))
		copy(*bp, msg)
		buf := mem.NewBuffer(bp, pool)
		var m inMsg
		if err := (wireCodec{}).Unmarshal(mem.BufferSlice{buf}, &m); err != nil {
			t.Fatal(err)
		}
		buf.Free() // gRPC frees its reference after Unmarshal
		if !bytes.Equal(m.frame, frame) || &m.frame[0] != &(*bp)[len(msg)-len(frame)] {
			t.Fatal("frame not aliased to the received buffer")
		}
		if pool.puts.Load() != 0 {
			t.Fatal("buffer freed while the frame is in use")
		}
		m.release()
		if pool.puts.Load() != 1 || m.frame != nil {
			t.Errorf("after release: %d puts, frame %v", pool.puts.Load(), m.frame != nil)
		}
	})

	t.Run("several buffers are joined", func(t *testing.T) {
		var m inMsg
		for _, n := range []int{1, 2, 7, 16384} {
			if err := (wireCodec{}).Unmarshal(split(msg, n), &m); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m.frame, frame) {
				t.Fatalf("buffers of %d bytes: frame differs", n)
			}
		}
		m.release()
	})

	t.Run("protobuf messages", func(t *testing.T) {
		tests := []struct {
			name  string
			req   *pdservev1.PushRequest
			check func(m *inMsg) bool
		}{
			{"header", headerMsg(testShape), func(m *inMsg) bool {
				return cmp.Equal(m.header, testShape.proto(), protocmp.Transform())
			}},
			{"commit", commitMsg(-5), func(m *inMsg) bool { return m.commit.GetFirstToken() == -5 }},
			{"empty frame", frameMsg(nil), func(m *inMsg) bool { return m.frame != nil && len(m.frame) == 0 }},
		}
		for _, tc := range tests {
			b, err := proto.Marshal(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			var m inMsg
			if err := (wireCodec{}).Unmarshal(split(b, 3), &m); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if !tc.check(&m) {
				t.Errorf("%s: unmarshaled to %+v", tc.name, m)
			}
		}
	})

	t.Run("frame written with other fields first", func(t *testing.T) {
		// Last oneof field wins in protobuf: a header field followed by a
		// frame field is a frame, decoded the slow way.
		hb, _ := proto.Marshal(headerMsg(testShape))
		b := append(hb, wireMsg(frame)...)
		var m inMsg
		if err := (wireCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &m); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.frame, frame) || m.header != nil {
			t.Error("mixed message not decoded as its last field")
		}
	})

	t.Run("bad messages", func(t *testing.T) {
		for name, b := range map[string][]byte{
			"empty":          nil,
			"truncated":      msg[:len(msg)/2],
			"unknown field":  {0x20, 0x01},
			"garbage varint": {0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		} {
			var m inMsg
			if err := (wireCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &m); err == nil {
				t.Errorf("%s: Unmarshal = nil error (%+v)", name, m)
			}
		}
	})
}

func TestSizedPool(t *testing.T) {
	var p sizedPool
	for _, n := range []int{0, 1, 1000, 1024, 1025, 16384, 1 << 20, 3<<20 + 1, 1<<26 + 1} {
		b := p.Get(n)
		if len(*b) != n {
			t.Fatalf("Get(%d) has length %d", n, len(*b))
		}
		p.Put(b)
		if c := p.Get(n); len(*c) != n {
			t.Fatalf("Get(%d) after Put has length %d", n, len(*c))
		}
	}
	b := p.Get(100)
	*b = append(*b, make([]byte, 5000)...) // grown by append after Get
	p.Put(b)
	p.Put(nil)
	for range 3 {
		if c := p.Get(4096); len(*c) != 4096 || cap(*c) < 4096 {
			t.Fatalf("Get(4096): len %d cap %d", len(*c), cap(*c))
		}
	}
}
