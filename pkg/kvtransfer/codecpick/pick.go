package codecpick

import (
	"errors"
	"fmt"
	"math"
)

// Codec names that ask for a choice per transfer: Auto among the lossless
// codecs, AutoLossy among every codec, fp8 and int8 included (a policy
// that accepts their error).
const (
	Auto      = "auto"
	AutoLossy = "auto-lossy"
)

// AutoName reports whether name asks for a choice per transfer, and
// whether lossy codecs may be chosen.
func AutoName(name string) (auto, lossy bool) {
	switch name {
	case Auto:
		return true, false
	case AutoLossy:
		return true, true
	}
	return false, false
}

// DefaultLinkBytesPerSec is the link throughput assumed before any
// transfer to a destination was measured: 10 Gb/s.
const DefaultLinkBytesPerSec = 10e9 / 8

// Candidate is one codec the sender may use.
type Candidate struct {
	Name     string
	Lossless bool
	// Ratio is raw bytes over wire bytes, > 0.
	Ratio float64
	// EncodeBytesPerSec is the raw bytes/s the sender encodes per core,
	// > 0 (a candidate without it is skipped).
	EncodeBytesPerSec float64
	// DecodeBytesPerSec is the raw bytes/s the receiver decodes per core;
	// 0 when unknown (see the package doc).
	DecodeBytesPerSec float64
}

// Input is one transfer to choose a codec for.
type Input struct {
	// RawBytes is the canonical KV bytes to send, > 0.
	RawBytes int64
	// LinkBytesPerSec is the measured wire throughput one transfer
	// achieves to the destination; ≤ 0 when none was measured yet
	// (DefaultLinkBytesPerSec is assumed).
	LinkBytesPerSec float64
	// EncodeCores and DecodeCores are the cores the transfer codes with
	// at each end, > 0; fractional when transfers share cores.
	EncodeCores, DecodeCores float64
	// AllowLossy lets the choice fall on a lossy codec (policy).
	AllowLossy bool
	// Candidates are the codecs to choose from, in order of preference on
	// a tie. At least one must be usable.
	Candidates []Candidate
}

// Bound names the stage that limits a transfer.
type Bound string

// Stages.
const (
	BoundLink   Bound = "link"
	BoundEncode Bound = "encode"
	BoundDecode Bound = "decode"
)

// Prediction is the model's time for one candidate.
type Prediction struct {
	Codec string
	// Seconds is the predicted time to deliver the KV; +Inf when the
	// candidate was not considered (Skipped says why).
	Seconds float64
	Bound   Bound  // the limiting stage; "" when skipped
	Skipped string // why the candidate was not considered; "" when it was
}

// Choice is the codec to use and why.
type Choice struct {
	Codec string
	// Seconds is Codec's predicted time to deliver the KV.
	Seconds float64
	// Reason is one short line for logs and the request's budget, e.g.
	// "bf16 1.46x: 4.1 ms, link-bound at 1.2 Gb/s measured; none 6.0 ms".
	Reason string
	// LinkBytesPerSec is the link throughput the model used (the
	// measurement, or DefaultLinkBytesPerSec).
	LinkBytesPerSec float64
	// Predictions has one entry per candidate, in input order.
	Predictions []Prediction
}

// ErrNoCandidate: no candidate can be used (none given, none allowed by
// the lossy policy, or none with an encode speed).
var ErrNoCandidate = errors.New("codecpick: no usable codec")

// ErrBadInput: RawBytes or cores not positive, or a candidate's ratio or
// speeds not positive and finite.
var ErrBadInput = errors.New("codecpick: invalid input")

// Pick returns the candidate that delivers in.RawBytes soonest under the
// time model of the package doc. Errors: ErrBadInput, ErrNoCandidate,
// wrapped with detail.
func Pick(in Input) (Choice, error) {
	switch {
	case in.RawBytes <= 0:
		return Choice{}, fmt.Errorf("%w: raw bytes %d", ErrBadInput, in.RawBytes)
	case !positive(in.EncodeCores) || !positive(in.DecodeCores):
		return Choice{}, fmt.Errorf("%w: cores %v (encode), %v (decode)", ErrBadInput, in.EncodeCores, in.DecodeCores)
	case math.IsNaN(in.LinkBytesPerSec) || math.IsInf(in.LinkBytesPerSec, 0):
		return Choice{}, fmt.Errorf("%w: link throughput %v", ErrBadInput, in.LinkBytesPerSec)
	}
	link, measured := in.LinkBytesPerSec, true
	if link <= 0 {
		link, measured = DefaultLinkBytesPerSec, false
	}
	raw := float64(in.RawBytes)
	ch := Choice{LinkBytesPerSec: link, Seconds: math.Inf(1)}
	best := -1
	for i, c := range in.Candidates {
		p := Prediction{Codec: c.Name, Seconds: math.Inf(1)}
		switch {
		case !positive(c.Ratio) || (c.DecodeBytesPerSec != 0 && !positive(c.DecodeBytesPerSec)) || c.EncodeBytesPerSec < 0 || math.IsNaN(c.EncodeBytesPerSec) || math.IsInf(c.EncodeBytesPerSec, 0):
			return Choice{}, fmt.Errorf("%w: codec %q: ratio %v, encode %v, decode %v bytes/s", ErrBadInput, c.Name, c.Ratio, c.EncodeBytesPerSec, c.DecodeBytesPerSec)
		case !c.Lossless && !in.AllowLossy:
			p.Skipped = "lossy, not allowed"
		case c.EncodeBytesPerSec == 0:
			p.Skipped = "no encode speed"
		default:
			p.Seconds, p.Bound = raw/(c.Ratio*link), BoundLink
			if t := raw / (c.EncodeBytesPerSec * in.EncodeCores); t > p.Seconds {
				p.Seconds, p.Bound = t, BoundEncode
			}
			if c.DecodeBytesPerSec > 0 {
				if t := raw / (c.DecodeBytesPerSec * in.DecodeCores); t > p.Seconds {
					p.Seconds, p.Bound = t, BoundDecode
				}
			}
			if best < 0 || p.Seconds < ch.Seconds {
				best, ch.Seconds = i, p.Seconds
			}
		}
		ch.Predictions = append(ch.Predictions, p)
	}
	if best < 0 {
		return Choice{}, fmt.Errorf("%w among %d candidates (lossy allowed: %v)", ErrNoCandidate, len(in.Candidates), in.AllowLossy)
	}
	c, p := in.Candidates[best], ch.Predictions[best]
	ch.Codec = c.Name
	src := "measured"
	if !measured {
		src = "assumed, none measured yet"
	}
	ch.Reason = fmt.Sprintf("%s %.2fx: %s, %s-bound; link %.3g Gb/s %s", c.Name, c.Ratio, fmtSeconds(p.Seconds), p.Bound, link*8/1e9, src)
	// The runner-up, so that a reader sees the margin.
	second := -1
	for i, q := range ch.Predictions {
		if i != best && q.Skipped == "" && (second < 0 || q.Seconds < ch.Predictions[second].Seconds) {
			second = i
		}
	}
	if second >= 0 {
		q := ch.Predictions[second]
		ch.Reason += fmt.Sprintf("; next %s %s (%s-bound)", q.Codec, fmtSeconds(q.Seconds), q.Bound)
	}
	return ch, nil
}

func positive(x float64) bool { return x > 0 && !math.IsInf(x, 0) }

// fmtSeconds writes s in milliseconds, three significant digits.
func fmtSeconds(s float64) string { return fmt.Sprintf("%.3g ms", s*1e3) }
