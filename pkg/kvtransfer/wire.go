package kvtransfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
)

// CodecName is the gRPC content subtype of the Push stream
// (content-type "application/grpc+pdkv"). Its codec is registered with gRPC
// when this package is imported.
const CodecName = "pdkv"

// Wire layout. Every message of the Push stream is a valid protobuf
// PushRequest; a frame message is the single field
//
//	0x12 (field 2, length-delimited) | uvarint(len(frame)) | frame
//
// which the codec writes and reads itself, so the frame bytes are never
// copied by protobuf.
const (
	frameTag       = 2<<3 | 2 // PushRequest.frame, wire type LEN
	maxFramePrefix = 1 + binary.MaxVarintLen32
)

func init() { encoding.RegisterCodecV2(wireCodec{}) }

// protoCodec is gRPC's proto codec, to which wireCodec delegates every
// protobuf message.
var protoCodec = encoding.GetCodecV2(protocodec.Name)

// wireCodec is the encoding.CodecV2 of the Push stream. It marshals an
// *outFrame (a frame the Sender built into a pooled buffer) by handing that
// buffer to gRPC as is, unmarshals into an *inMsg by keeping a reference to
// (or, for a frame spread over several HTTP/2 data frames, one copy of) the
// received bytes, and delegates every other value, which must be a protobuf
// message, to the proto codec. Safe for concurrent use (it has no state).
type wireCodec struct{}

var _ encoding.CodecV2 = wireCodec{}

func (wireCodec) Name() string { return CodecName }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*outFrame); ok {
		if f.buf == nil {
			return nil, errors.New("kvtransfer: frame marshaled twice")
		}
		b := f.buf
		f.buf = nil // the reference now belongs to gRPC, which frees it once written
		return mem.BufferSlice{b}, nil
	}
	return protoCodec.Marshal(v)
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(*inMsg); ok {
		return m.unmarshal(data)
	}
	return protoCodec.Unmarshal(data, v)
}

// outFrame is one frame message on its way out. buf holds one reference to a
// pooled buffer whose bytes are the complete message (tag, length, frame).
type outFrame struct {
	buf mem.Buffer
}

// inMsg receives one message of the Push stream on the server. It is reused
// for every message of a stream; release must be called once the frame was
// consumed. Not safe for concurrent use.
type inMsg struct {
	// Exactly one of frame, header and commit is set after unmarshal.
	frame  []byte // valid until release
	header *pdservev1.KVStreamHeader
	commit *pdservev1.KVCommit

	ref     mem.Buffer // reference held on the received bytes when frame aliases them
	scratch *[]byte    // pooled copy of a frame that arrived in several buffers
}

// release drops the reference on the received bytes; frame becomes invalid.
func (m *inMsg) release() {
	if m.ref != nil {
		m.ref.Free()
		m.ref = nil
	}
	if m.scratch != nil {
		bufs.Put(m.scratch)
		m.scratch = nil
	}
	m.frame, m.header, m.commit = nil, nil, nil
}

func (m *inMsg) unmarshal(data mem.BufferSlice) error {
	m.release()
	n := data.Len()
	var head [maxFramePrefix]byte
	h := head[:data.CopyTo(head[:])]
	if len(h) > 1 && h[0] == frameTag {
		size, k := binary.Uvarint(h[1:])
		if k > 0 && uint64(n-1-k) == size {
			// The message is exactly one frame field: take the frame
			// without protobuf.
			off := 1 + k
			if len(data) == 1 {
				data[0].Ref()
				m.ref = data[0]
				m.frame = data[0].ReadOnlyData()[off:]
				return nil
			}
			m.scratch = bufs.Get(int(size))
			m.frame = *m.scratch
			copyFrom(m.frame, data, off)
			return nil
		}
	}
	// Anything else is decoded as protobuf: a header, a commit, or a frame
	// written by another encoder (then copied, which is correct but slower).
	var req pdservev1.PushRequest
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), &req); err != nil {
		return fmt.Errorf("kvtransfer: push message: %w", err)
	}
	switch x := req.GetMsg().(type) {
	case *pdservev1.PushRequest_Header:
		m.header = x.Header
	case *pdservev1.PushRequest_Commit:
		m.commit = x.Commit
	case *pdservev1.PushRequest_Frame:
		m.frame = x.Frame
	default:
		return errors.New("kvtransfer: push message is empty")
	}
	return nil
}

// copyFrom copies the bytes of data that start at offset off into dst.
func copyFrom(dst []byte, data mem.BufferSlice, off int) {
	for _, b := range data {
		p := b.ReadOnlyData()
		if off >= len(p) {
			off -= len(p)
			continue
		}
		n := copy(dst, p[off:])
		dst = dst[n:]
		off = 0
		if len(dst) == 0 {
			return
		}
	}
}

// sizedPool is a mem.BufferPool in power-of-two size classes from 1 KiB
// to 64 MiB; larger buffers are allocated and dropped. Get returns a buffer
// of exactly the length asked for, with a capacity of at least that; Put
// takes any buffer (also one grown by append after Get) into the largest
// class its capacity fills. Buffers come back dirty: their users write
// before they read, as gRPC does, so nothing is cleared. Safe for
// concurrent use.
type sizedPool struct {
	classes [maxClass - minClass + 1]sync.Pool // of *[]byte
}

const (
	minClass = 10 // 1 KiB
	maxClass = 26 // 64 MiB
)

var _ mem.BufferPool = (*sizedPool)(nil)

// bufs holds the package's frame buffers and gRPC's receive buffers.
var bufs sizedPool

func (p *sizedPool) Get(length int) *[]byte {
	c := max(minClass, bits.Len(uint(max(length, 1)-1))) // smallest class that fits
	if c > maxClass {
		b := make([]byte, length)
		return &b
	}
	if bp, ok := p.classes[c-minClass].Get().(*[]byte); ok {
		*bp = (*bp)[:length]
		return bp
	}
	b := make([]byte, length, 1<<c)
	return &b
}

func (p *sizedPool) Put(bp *[]byte) {
	if bp == nil {
		return
	}
	c := bits.Len(uint(cap(*bp))) - 1 // largest class it fills
	if c < minClass || c > maxClass {
		return
	}
	p.classes[c-minClass].Put(bp)
}
