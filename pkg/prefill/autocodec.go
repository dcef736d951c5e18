package prefill

import "github.com/pdserve/pdserve/pkg/kvtransfer/codecpick"

// Codec names that make the worker choose the codec per transfer (see the
// package doc and kvtransfer.CodecChooser): CodecAuto among the lossless
// codecs, CodecAutoLossy among every codec, fp8 and int8 included (a
// policy that accepts their error).
const (
	CodecAuto      = codecpick.Auto
	CodecAutoLossy = codecpick.AutoLossy
)
