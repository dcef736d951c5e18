package ref

import (
	"encoding/binary"
	"fmt"

	"github.com/pdserve/pdserve/pkg/engine"
)

// seqState is one sequence's KV cache: per layer, K and V as bfloat16 bits
// in the canonical [token][kv head][head dim] order, plus the number of
// tokens each layer holds (they differ only while an import is under way).
type seqState struct {
	lens []int
	k, v [][]uint16 // per layer; capacity grows on demand, up to MaxSeqLen tokens
}

func newSeqState(layers int) *seqState {
	return &seqState{lens: make([]int, layers), k: make([][]uint16, layers), v: make([][]uint16, layers)}
}

// reset empties the state, keeping its buffers for reuse.
func (s *seqState) reset() {
	for l := range s.lens {
		s.lens[l] = 0
	}
}

// length returns the token count of a sequence whose layers agree, or
// ErrIncompleteKV.
func (s *seqState) length() (int, error) {
	n := s.lens[0]
	for l, m := range s.lens {
		if m != n {
			return 0, fmt.Errorf("layer 0 holds %d tokens, layer %d holds %d: %w", n, l, m, engine.ErrIncompleteKV)
		}
	}
	return n, nil
}

// reserve makes room for tokens in layer l (the elements of one token
// being elems), growing by doubling so appends cost amortised O(1) and no
// allocation once a sequence has reached its length. limit caps the
// capacity (MaxSeqLen).
func (s *seqState) reserve(l, tokens, elems, limit int) {
	need := tokens * elems
	if cap(s.k[l]) >= need {
		s.k[l] = s.k[l][:need]
		s.v[l] = s.v[l][:need]
		return
	}
	c := min(max(tokens, 2*cap(s.k[l])/elems, 64), limit)
	k := make([]uint16, need, c*elems)
	v := make([]uint16, need, c*elems)
	copy(k, s.k[l][:s.lens[l]*elems])
	copy(v, s.v[l][:s.lens[l]*elems])
	s.k[l], s.v[l] = k, v
}

// appendCanonical appends the canonical bytes of tokens [start, end) of
// layer l (K then V, little-endian bf16) to dst.
func (s *seqState) appendCanonical(dst []byte, l, start, end, elems int) []byte {
	k := s.k[l][start*elems : end*elems]
	v := s.v[l][start*elems : end*elems]
	n := len(dst)
	dst = append(dst, make([]byte, 2*(len(k)+len(v)))...)
	out := dst[n:]
	for i, b := range k {
		binary.LittleEndian.PutUint16(out[2*i:], b)
	}
	out = out[2*len(k):]
	for i, b := range v {
		binary.LittleEndian.PutUint16(out[2*i:], b)
	}
	return dst
}

// setCanonical writes canonical bytes of n tokens at token start of layer
// l; the caller has reserved the room.
func (s *seqState) setCanonical(data []byte, l, start, n, elems int) {
	k := s.k[l][start*elems : (start+n)*elems]
	v := s.v[l][start*elems : (start+n)*elems]
	for i := range k {
		k[i] = binary.LittleEndian.Uint16(data[2*i:])
	}
	data = data[2*len(k):]
	for i := range v {
		v[i] = binary.LittleEndian.Uint16(data[2*i:])
	}
}
