package codecpick

import "github.com/pdserve/pdserve/pkg/kv/codec"

// Candidates returns one candidate per codec the sender measured (local,
// from codec.SelfBench on the sender, in its order: none first), with the
// sender's encode speed and ratio and the receiver's decode speed per core
// from decode (by codec name; a missing name, or a nil map, is unknown).
// The caller owns the slice.
func Candidates(local codec.Speeds, decode map[string]float64) []Candidate {
	out := make([]Candidate, 0, len(local.Codecs))
	for _, s := range local.Codecs {
		out = append(out, Candidate{
			Name:              s.Codec,
			Lossless:          s.Lossless,
			Ratio:             s.Ratio,
			EncodeBytesPerSec: s.EncodeBytesPerSec,
			DecodeBytesPerSec: decode[s.Codec],
		})
	}
	return out
}
