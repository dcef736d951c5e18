package llamacpp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A sequence's KV leaves and enters llama.cpp as the blob of
// llama_state_seq_get_data / llama_state_seq_set_data (the unified KV
// cache's format, src/llama-kv-cache.cpp state_write):
//
//	u32 magic, i32 seq id
//	u32 n_stream; per stream: u32 cell_count, and when > 0:
//	  cell_count × (i32 pos, u32 n_seq_id, [ext], n_seq_id × i32 seq id)
//	  u32 v_trans, u32 n_layer
//	  n_layer × (i32 k type, u64 k row bytes, cell_count rows)
//	  v_trans = 0: n_layer × (i32 v type, u64 v row bytes, cell_count rows)
//	  v_trans = 1: n_layer × (i32 v type, u32 element bytes, u32 n_embd_v,
//	               n_embd_v × cell_count elements)
//
// Cells come in cache order, not position order. The engine's canonical
// chunk of one layer for tokens [start, end) is the K rows of those
// positions, then their V rows (V gathered back into rows when llama.cpp
// keeps it transposed).

var errBlob = errors.New("llamacpp: unexpected sequence state layout")

const stateMagic = 0xaf143cd8

// layout is what a probe of the engine's own state tells about its blobs.
type layout struct {
	nStream  uint32
	extBytes int // per-cell extension (M-RoPE, n-gram) bytes; 0 for most models
	vTrans   bool
	nLayer   int
	kType    int32
	vType    int32
	kRow     int // bytes of one cell's K row
	vRow     int // bytes of one cell's V row (vTrans: elements × element bytes)
	vElem    int // element bytes of V (vTrans only)
}

// view locates a parsed blob's rows. Offsets index the blob.
type view struct {
	cells int
	byPos []int // byPos[p] = cell index of position p, for p in [0, cells)
	kOff  []int // per layer, start of the K rows
	vOff  []int // per layer, start of the V rows (or elements)
}

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) u32() uint32 {
	if r.err != nil || r.off+4 > len(r.b) {
		r.err = errBlob
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) u64() uint64 {
	if r.err != nil || r.off+8 > len(r.b) {
		r.err = errBlob
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

func (r *reader) skip(n int) {
	if r.err != nil || n < 0 || r.off+n > len(r.b) {
		r.err = errBlob
		return
	}
	r.off += n
}

// probeLayout derives the layout from the blob of a sequence of exactly
// one cell, trying each plausible per-cell extension size.
func probeLayout(b []byte) (layout, error) {
	for _, ext := range []int{0, 12} {
		lo, err := parseLayout(b, ext)
		if err == nil {
			return lo, nil
		}
	}
	return layout{}, fmt.Errorf("%w (%d bytes for one cell)", errBlob, len(b))
}

func parseLayout(b []byte, ext int) (layout, error) {
	lo := layout{extBytes: ext}
	r := &reader{b: b}
	if r.u32() != stateMagic {
		return lo, errBlob
	}
	r.u32() // seq id
	lo.nStream = r.u32()
	if lo.nStream == 0 || lo.nStream > 1024 {
		return lo, errBlob
	}
	found := false
	for range lo.nStream {
		n := r.u32()
		if n == 0 {
			continue
		}
		if n != 1 || found {
			return lo, errBlob
		}
		found = true
		r.skip(4) // pos
		nSeq := r.u32()
		if nSeq != 1 {
			return lo, errBlob
		}
		r.skip(ext + 4)
		vt := r.u32()
		if vt > 1 {
			return lo, errBlob
		}
		lo.vTrans = vt == 1
		lo.nLayer = int(r.u32())
		if lo.nLayer <= 0 || lo.nLayer > 4096 {
			return lo, errBlob
		}
		for l := range lo.nLayer {
			kt := int32(r.u32())
			kr := int(r.u64())
			if l == 0 {
				lo.kType, lo.kRow = kt, kr
			} else if kt != lo.kType || kr != lo.kRow {
				return lo, fmt.Errorf("%w: layers with different K rows", errBlob)
			}
			r.skip(kr)
		}
		for l := range lo.nLayer {
			vt := int32(r.u32())
			var vr, el int
			if lo.vTrans {
				el = int(r.u32())
				n := int(r.u32())
				vr = el * n
			} else {
				vr = int(r.u64())
			}
			if l == 0 {
				lo.vType, lo.vRow, lo.vElem = vt, vr, el
			} else if vt != lo.vType || vr != lo.vRow {
				return lo, fmt.Errorf("%w: layers with different V rows", errBlob)
			}
			r.skip(vr)
		}
	}
	if r.err != nil || !found || r.off != len(b) {
		return lo, errBlob
	}
	return lo, nil
}

// parse locates the rows of a blob of this layout holding positions
// [0, want) of one sequence.
func (lo *layout) parse(b []byte, want int, v *view) error {
	r := &reader{b: b}
	if r.u32() != stateMagic {
		return errBlob
	}
	r.u32()
	if r.u32() != lo.nStream {
		return errBlob
	}
	v.cells = 0
	v.kOff, v.vOff = v.kOff[:0], v.vOff[:0]
	for range lo.nStream {
		n := int(r.u32())
		if n == 0 {
			continue
		}
		if v.cells != 0 || n != want {
			return fmt.Errorf("%w: %d cells, want %d", errBlob, n, want)
		}
		v.cells = n
		if cap(v.byPos) < n {
			v.byPos = make([]int, n)
		}
		v.byPos = v.byPos[:n]
		for i := range v.byPos {
			v.byPos[i] = -1
		}
		for c := range n {
			pos := int(int32(r.u32()))
			nSeq := int(r.u32())
			r.skip(lo.extBytes + 4*nSeq)
			if r.err != nil || pos < 0 || pos >= n || v.byPos[pos] >= 0 {
				return fmt.Errorf("%w: cell %d holds position %d of %d", errBlob, c, pos, n)
			}
			v.byPos[pos] = c
		}
		if r.u32() != b2u(lo.vTrans) || int(r.u32()) != lo.nLayer {
			return errBlob
		}
		for range lo.nLayer {
			r.skip(12)
			v.kOff = append(v.kOff, r.off)
			r.skip(n * lo.kRow)
		}
		for range lo.nLayer {
			r.skip(12) // type and row size, or type, element size and width
			v.vOff = append(v.vOff, r.off)
			r.skip(n * lo.vRow)
		}
	}
	if r.err != nil || v.cells != want {
		return errBlob
	}
	return nil
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// appendRows appends the canonical chunk of layer for positions
// [start, end) of a parsed blob to dst.
func (lo *layout) appendRows(dst, b []byte, v *view, layer, start, end int) []byte {
	for p := start; p < end; p++ {
		c := v.byPos[p]
		dst = append(dst, b[v.kOff[layer]+c*lo.kRow:][:lo.kRow]...)
	}
	if !lo.vTrans {
		for p := start; p < end; p++ {
			c := v.byPos[p]
			dst = append(dst, b[v.vOff[layer]+c*lo.vRow:][:lo.vRow]...)
		}
		return dst
	}
	nEmbd := lo.vRow / lo.vElem
	for p := start; p < end; p++ {
		c := v.byPos[p]
		for j := range nEmbd {
			off := v.vOff[layer] + (j*v.cells+c)*lo.vElem
			dst = append(dst, b[off:off+lo.vElem]...)
		}
	}
	return dst
}

// blobSize is the size of a blob of n cells in position order.
func (lo *layout) blobSize(n int) int {
	meta := n * (4 + 4 + lo.extBytes + 4)
	size := 4 + 4 + 4 + 4*int(lo.nStream) + meta + 8
	size += lo.nLayer * (12 + n*lo.kRow)
	size += lo.nLayer * (12 + n*lo.vRow)
	return size
}

// build writes the blob of a sequence of n cells, positions 0 … n-1, from
// canonical layer data: layers[l] holds n tokens of layer l (K rows, then
// V rows). lo.extBytes must be 0.
func (lo *layout) build(dst []byte, seq int32, n int, layers [][]byte) []byte {
	le := binary.LittleEndian
	dst = le.AppendUint32(dst[:0], stateMagic)
	dst = le.AppendUint32(dst, uint32(seq))
	dst = le.AppendUint32(dst, lo.nStream)
	for s := range lo.nStream {
		if s != 0 {
			dst = le.AppendUint32(dst, 0)
			continue
		}
		dst = le.AppendUint32(dst, uint32(n))
		for p := range n {
			dst = le.AppendUint32(dst, uint32(p))
			dst = le.AppendUint32(dst, 1)
			dst = le.AppendUint32(dst, uint32(seq))
		}
		dst = le.AppendUint32(dst, b2u(lo.vTrans))
		dst = le.AppendUint32(dst, uint32(lo.nLayer))
		for l := range lo.nLayer {
			dst = le.AppendUint32(dst, uint32(lo.kType))
			dst = le.AppendUint64(dst, uint64(lo.kRow))
			dst = append(dst, layers[l][:n*lo.kRow]...)
		}
		for l := range lo.nLayer {
			dst = le.AppendUint32(dst, uint32(lo.vType))
			vdata := layers[l][n*lo.kRow:]
			if !lo.vTrans {
				dst = le.AppendUint64(dst, uint64(lo.vRow))
				dst = append(dst, vdata[:n*lo.vRow]...)
				continue
			}
			nEmbd := lo.vRow / lo.vElem
			dst = le.AppendUint32(dst, uint32(lo.vElem))
			dst = le.AppendUint32(dst, uint32(nEmbd))
			for j := range nEmbd {
				for p := range n {
					off := p*lo.vRow + j*lo.vElem
					dst = append(dst, vdata[off:off+lo.vElem]...)
				}
			}
		}
	}
	return dst
}
