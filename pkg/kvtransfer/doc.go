// Package kvtransfer streams a request's KV cache from a prefill worker to a
// decode worker over gRPC, bounded by the decode worker's reservation.
//
// # Wire
//
// One transfer is one client-streaming call of pdserve.v1.KVTransferService/Push
// (api/pdserve/v1/kvtransfer.proto): a KVStreamHeader, then frames of
// pkg/kv/codec (one layer × token range each), then a KVCommit; the server
// answers with a PushResponse (the Ack). Every message is a valid protobuf
// PushRequest, so any gRPC client can speak it. (The service is named
// KVTransferService rather than KVTransfer because buf's STANDARD lint
// requires the Service suffix.)
//
// # Peer pulls
//
// Pull (server-streaming) is the other direction: a worker asks a peer
// for the longest prefix of a prompt's block hashes that the peer's
// prefix cache holds in any tier (a PullSource, WithPullSource), and the
// peer answers a PullHeader and frames of whole tokens of the request's
// codec. Dialer.Pull checks every frame (CRC-32C, request id, dtype,
// layer, token ranges in order and complete) and the header against the
// puller's model, and paces like a push. Prefill and decode workers both
// serve it; a worker registered without a Receiver (a prefill worker)
// refuses Push with UNIMPLEMENTED. Pull needs the caller's prefill role,
// as Push does (grpcauth). PullPricer is the puller's side of the
// decision: the prefix's true KV size over the link to the peer
// (LinkStats over past pulls, or the assumed --peer-link-gbps) against
// the worker's measured prefill throughput.
//
// PullSequence is a live migration's pull: a decode worker that moved a
// running sequence out (a SequenceSource, WithSequenceSource) serves its
// KV (prompt and every output token but the last, not whole blocks) once
// to the worker that goes on generating it; Dialer.PullSequence checks
// it as Pull does, bounded by the puller's reservation, and paces it
// alike. It needs the same role as Pull.
//
// # No protobuf copy of bulk data
//
// Frames are large (up to the max frame bytes, default 1 MiB raw) and
// plentiful, so they bypass protobuf. The package registers a gRPC
// encoding.CodecV2 under the content subtype CodecName ("pdkv",
// content-type application/grpc+pdkv) that
//
//   - on send, takes a frame the Sender encoded with codec.AppendFrame into
//     a pooled buffer, with the two-to-six byte protobuf field prefix written
//     in front of it in the same buffer, and hands that buffer to gRPC as a
//     mem.Buffer. gRPC returns it to the pool once the HTTP/2 writer has
//     copied it to the socket, so the buffer is reused without a race while
//     gRPC still holds it;
//   - on receive, recognises a message that is exactly one frame field and
//     keeps a reference to gRPC's received buffer (or, when the message
//     spans several HTTP/2 data frames, copies it once into a per-stream
//     buffer), instead of protobuf's materialise-then-copy;
//   - delegates every protobuf message (header, commit, ack) to gRPC's proto
//     codec.
//
// The server handler is the generated one (RegisterKVTransferServiceServer)
// but reads with stream.RecvMsg into the package's own message type, which
// only this codec understands; calls that arrive with another content
// subtype (plain protobuf clients) are read with the generated Recv, one
// copy more. The Dialer selects the subtype on every call. The codec is
// chosen per call rather than forced on the grpc.Server, because the decode
// worker's server also hosts other services.
//
// # Bounds
//
// The server refuses a stream whose codec cannot code the receiver's KV
// dtype (codec.ErrDType: bf16, fp8 or int8 on q8_0 KV) before Begin; a
// Dialer refuses it in Open already, from StreamHeader.DType. The Receiver
// (the decode worker) checks the header against its reservation in Begin
// before anything else is read. The server then checks
// every frame's header (codec.PeekHeader) against the stream header before
// its payload is decoded: same request id and codec, the receiver's own KV
// dtype (given to Register: the stream header on the wire carries none,
// every frame carries its own), layer <
// Layers, the next token range of that layer (in order from the stream
// header's Start, 0 unless the receiver holds a cached prefix, so nothing
// is sent twice), End ≤ Tokens, RawLen == (End−Start) × TokenBytes ≤ the
// max frame bytes. It decodes into a buffer of at most RawLen bytes. A
// sender therefore cannot make the receiver hold more than the reserved KV,
// and Commit is refused until every layer holds [Start, Tokens).
//
// # Errors
//
// Errors cross the wire as gRPC status codes, mapped at the server edge:
// INVALID_ARGUMENT for a bad header or frame or an early commit,
// FAILED_PRECONDITION / RESOURCE_EXHAUSTED as returned by Begin, CANCELED /
// DEADLINE_EXCEEDED when the call ends early, INTERNAL for a sink failure
// without a status. On the client they come back wrapped (status.Code works
// on them), next to the package's sentinel errors (ErrBadChunk, ErrAborted,
// ...). After Begin succeeded, the Sink is ended exactly once: by a
// successful Commit or by one Abort.
//
// # Connections and pacing
//
// A Dialer keeps several connections per address (one HTTP/2 connection
// tops out near a core's worth of throughput) and spreads streams over them
// round robin; connections use large static flow-control windows and a
// raised message size limit. The server side needs the matching
// grpc.ServerOptions (GRPCServerOptions). With WithLinkGbps, Senders are
// paced as if their frames crossed one link of that bandwidth, charging each
// chunk's full size (engine.KVChunk.FullBytes) times the codec's wire/raw
// ratio, so a performance-model engine that ships scaled-down KV still pays
// the true transfer time. TLS is a Dialer option (WithTLS) and the
// grpc.Server's credentials; so are a token and other per-RPC credentials
// (WithGRPCDialOptions) and the server's interceptors.
//
// A Dialer pings its connections (WithKeepalive; default every
// DefaultKeepaliveTime of quiet, DefaultKeepaliveTimeout to answer), so
// that transfers to a hung decode worker fail with UNAVAILABLE within
// seconds, and closes the connections to an address that had no transfer
// open for the idle timeout (WithIdleTimeout, DefaultIdleTimeout): a
// decode worker that left is not dialed forever.
//
// # Link measurement
//
// A Sender reports the time it spent encoding (EncodeTime), and LinkStats
// keeps a moving average of the wire throughput per destination address,
// for the adaptive codec choice (package codecpick, used by the prefill
// worker).
//
// # Fuzzing
//
// FuzzPushStream feeds arbitrary message sequences through the server's
// Push handler (both codecs, messages split anywhere) against a receiver
// that checks the Sink contract; its seed corpus is under
// testdata/fuzz/FuzzPushStream:
//
//	go test -run '^$' -fuzz FuzzPushStream -fuzztime 3m -parallel 1 ./pkg/kvtransfer/
//
// # Failed-transfer status
//
// A prefill worker whose transfer to a decode worker failed ends its
// Prefill or Resend call with wire.KVTransferFailedStatus (an
// errdetails.ErrorInfo of wire.ErrorDomain and wire.ErrorReasonKVTransfer);
// the coordinator tells such a decode-side failure from a prefill worker's
// own with wire.IsKVTransferFailed, without depending on this package or
// the prefill worker's.
package kvtransfer
