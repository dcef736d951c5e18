// Package codecpick chooses the KV wire codec that delivers one transfer
// soonest, from measured figures: the link throughput to the destination,
// the sender's encode and the receiver's decode speeds, and each codec's
// compression ratio. It is a pure function of its input: no clock, no I/O.
//
// # Time model
//
// A transfer streams frames that the sender encodes, the link carries and
// the receiver decodes, one after the other but pipelined (the sender
// encodes frame i+1 while frame i crosses the link and frame i−1 is
// decoded), so its slowest stage sets the pace. For raw KV bytes R and a
// codec of ratio ρ (raw/wire):
//
//	t = max(R / encodeRate, R / (ρ · link), R / decodeRate)
//
// where encodeRate and decodeRate are raw bytes/s: the per-core speed
// times the cores the transfer codes with at that end. The fixed costs of
// a transfer (opening the stream, the first and last frame's latency) are
// the same for every codec, so they do not change the choice and the
// model leaves them out; t is the time of the bulk bytes.
//
// # Unknown figures
//
// With no measurement of the link yet (Input.LinkBytesPerSec ≤ 0), the
// model assumes DefaultLinkBytesPerSec (10 Gb/s, a common cluster link).
// A receiver whose decode speed for a codec is unknown (no heartbeat yet,
// or one from a worker that does not say) is assumed never to limit it,
// for every codec alike. A sender without an encode speed for a codec
// cannot predict it and does not pick it. Ties go to the codec listed
// first; list none first, then cheaper codecs, so that a tie costs no CPU.
package codecpick
