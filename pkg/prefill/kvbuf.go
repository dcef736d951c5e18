package prefill

import (
	"fmt"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/engine"
)

// frame names one chunk of a kvBuf: the KV of layer for tokens [start,
// end). fullBytes is the size it stands for on the link (engine.KVChunk.FullBytes).
type frame struct {
	layer, start, end int
	fullBytes         int
}

// kvBuf holds one request's KV, copied from the engine as it is computed.
// Each chunk is stored as the engine handed it out, in the canonical layout
// of its own token range (all K of the range, then all V), at byte offset
// start × tokenBytes of its layer's buffer; so the buffer is sent again
// (Resend) with the same chunk boundaries, never re-sliced. The batch's loop writes it (put, through the request's Outbox); a frame's bytes are read by sender
// goroutines only after put returned and the frame was handed over through a
// mutex, and they are never written again, so readers need no lock.
type kvBuf struct {
	layers     int
	tokens     int      // prompt tokens
	tokenBytes int      // bytes of one token in one layer; learnt from the first chunk
	data       [][]byte // data[l] has tokens × tokenBytes bytes once layer l got its first chunk
	filled     []int    // tokens written per layer
	frames     []frame  // every chunk in the order the engine produced it; read by Resend after the prefill completed
	// prov is where the KV came from, for the commit of each push of it
	// (kvtransfer.Commit.Provenance): set before the transfer is sealed.
	prov pdservev1.KVProvenance
}

// provenance is the KV provenance of a prompt whose prefix came from
// source ("": computed here) and was pulled unverified or not.
func provenance(source string, unverified bool) pdservev1.KVProvenance {
	switch {
	case unverified:
		return pdservev1.KVProvenance_KV_PROVENANCE_PULLED_UNVERIFIED
	case source != "":
		return pdservev1.KVProvenance_KV_PROVENANCE_PULLED_VERIFIED
	}
	return pdservev1.KVProvenance_KV_PROVENANCE_COMPUTED
}

func newKVBuf(layers, tokens int) *kvBuf {
	return &kvBuf{layers: layers, tokens: tokens, data: make([][]byte, layers), filled: make([]int, layers)}
}

// put copies c into the buffer. Chunks of a layer must arrive in token order
// (the engine computes them so). It returns the frame naming the copy.
func (b *kvBuf) put(c engine.KVChunk) (frame, error) {
	n := c.End - c.Start
	switch {
	case c.Layer < 0 || c.Layer >= b.layers:
		return frame{}, fmt.Errorf("prefill: kv chunk layer %d outside [0, %d)", c.Layer, b.layers)
	case n <= 0 || c.Start != b.filled[c.Layer] || c.End > b.tokens:
		return frame{}, fmt.Errorf("prefill: kv chunk of layer %d for tokens [%d, %d) does not follow token %d of %d", c.Layer, c.Start, c.End, b.filled[c.Layer], b.tokens)
	case len(c.Data) == 0 || len(c.Data)%n != 0:
		return frame{}, fmt.Errorf("prefill: kv chunk of layer %d has %d bytes for %d tokens", c.Layer, len(c.Data), n)
	}
	tb := len(c.Data) / n
	if b.tokenBytes == 0 {
		b.tokenBytes = tb
	} else if tb != b.tokenBytes {
		return frame{}, fmt.Errorf("prefill: kv chunk of layer %d has %d bytes per token, earlier chunks %d", c.Layer, tb, b.tokenBytes)
	}
	if b.data[c.Layer] == nil {
		b.data[c.Layer] = make([]byte, b.tokens*tb)
	}
	copy(b.data[c.Layer][c.Start*tb:c.End*tb], c.Data)
	b.filled[c.Layer] = c.End
	f := frame{layer: c.Layer, start: c.Start, end: c.End, fullBytes: c.FullBytes}
	b.frames = append(b.frames, f)
	return f, nil
}

// bytes returns the frame's canonical KV, aliasing the buffer.
func (b *kvBuf) bytes(f frame) []byte {
	return b.data[f.layer][f.start*b.tokenBytes : f.end*b.tokenBytes]
}

// size returns the bytes the buffer holds once complete.
func (b *kvBuf) size() int64 { return int64(b.layers) * int64(b.tokens) * int64(b.tokenBytes) }

// complete reports whether every layer holds every token.
func (b *kvBuf) complete() bool {
	for _, n := range b.filled {
		if n != b.tokens {
			return false
		}
	}
	return true
}

// reset forgets every chunk put, before any frame was handed out (a
// prefix the batch could not take: it computes the whole prompt).
func (b *kvBuf) reset() {
	clear(b.data)
	clear(b.filled)
	b.frames, b.tokenBytes = nil, 0
}
