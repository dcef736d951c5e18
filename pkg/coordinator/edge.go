package coordinator

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/coordinator/flow"
	"github.com/pdserve/pdserve/pkg/frontend"
	"github.com/pdserve/pdserve/pkg/router"
	"github.com/pdserve/pdserve/pkg/wire"
	"github.com/pdserve/pdserve/pkg/wire/vocab"
)

// The flow's edge: the shell converts the workers' messages and statuses
// to the flow's Go types here, and the flow's failures to client errors.

// callError returns the flow's form of a worker call's error (nil for
// nil): its gRPC code's class, and whether it is a failed KV transfer or
// a grammar that allows no token.
func callError(err error) *flow.CallError {
	if err == nil {
		return nil
	}
	e := &flow.CallError{Err: err, Transfer: wire.IsKVTransferFailed(err), Grammar: wire.IsGrammarRefused(err)}
	switch status.Code(err) {
	case codes.Unknown, codes.Internal, codes.Aborted, codes.Canceled, codes.DeadlineExceeded:
		e.Code = flow.CodeBroken
	case codes.Unavailable:
		e.Code = flow.CodeUnavailable
	case codes.ResourceExhausted:
		e.Code = flow.CodeFull
	case codes.InvalidArgument, codes.OutOfRange:
		e.Code = flow.CodeInvalid
	case codes.FailedPrecondition:
		e.Code = flow.CodeLost
	default:
		e.Code = flow.CodeRefused
	}
	return e
}

// unixTime is the time of Unix nanoseconds ns; zero for 0 (not said).
func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// prefillEvent returns the event of a Prefill stream's message of
// attempt, nil for one the flow does not read (an empty one).
func prefillEvent(attempt int, resp *pdservev1.PrefillResponse) flow.Event {
	switch e := resp.GetEvent().(type) {
	case *pdservev1.PrefillResponse_Queued:
		return flow.PrefillQueued{Attempt: attempt, At: unixTime(e.Queued.GetUnixNano())}
	case *pdservev1.PrefillResponse_FirstToken:
		ft := e.FirstToken
		return flow.FirstToken{Attempt: attempt, Token: ft.GetToken(), Logprob: wire.FromTokenLogprob(ft.GetLogprob()),
			Start: unixTime(ft.GetPrefillStartUnixNano()), End: unixTime(ft.GetPrefillEndUnixNano()), Batch: int(ft.GetBatchSize()),
			Hits: hits(ft.GetHit())}
	case *pdservev1.PrefillResponse_KvDone:
		return flow.KVDone{Attempt: attempt, KV: kvReport(e.KvDone)}
	}
	return nil
}

// hits is the flow's form of a PrefixHit message (none for nil).
func hits(h *pdservev1.PrefixHit) flow.Hits {
	return flow.Hits{Prefix: int(h.GetTokens()), Host: int(h.GetHostTokens()), HostLoad: time.Duration(h.GetHostLoadNanos()),
		Disk: int(h.GetDiskTokens()), Peer: int(h.GetPeerTokens()), PeerLoad: time.Duration(h.GetPeerLoadNanos())}
}

// kvReport is the flow's form of a KVDone message.
func kvReport(kd *pdservev1.KVDone) flow.KV {
	return flow.KV{FirstByte: unixTime(kd.GetFirstByteUnixNano()), Done: unixTime(kd.GetDoneUnixNano()),
		BytesRaw: kd.GetBytesRaw(), BytesWire: kd.GetBytesWire(), Codec: kd.GetCodec(), CodecReason: kd.GetCodecReason()}
}

// tokensEvent returns the event of a Generate stream's message of attempt.
func tokensEvent(attempt int, resp *pdservev1.GenerateResponse) flow.Tokens {
	t := flow.Tokens{Attempt: attempt, Index: int(resp.GetIndex()), Tokens: resp.GetTokens(),
		Logprobs: wire.FromTokenLogprobs(resp.GetLogprobs()), Finish: wire.Finish(resp),
		Batch: int(resp.GetBatchSize()),
		Hits:  hits(resp.GetHit()), PromptLogprobs: wire.FromTokenLogprobs(resp.GetPromptLogprobs()), Migrated: resp.GetMigrated()}
	for _, s := range resp.GetStamps() {
		var at *time.Time
		switch wire.FromStampKind(s.GetKind()) {
		case vocab.StampPrefillStart:
			at = &t.Stamps.PrefillStart
		case vocab.StampPrefillEnd:
			at = &t.Stamps.PrefillEnd
		case vocab.StampDecodeJoined:
			at = &t.Stamps.DecodeJoined
		default:
			continue
		}
		if at.IsZero() {
			// The first of a name counts, as the budget keeps the first.
			*at = unixTime(s.GetUnixNano())
		}
	}
	return t
}

// delivered is the answer to a Deliver action whose write returned err.
func delivered(err error) flow.Delivered {
	if errors.Is(err, frontend.ErrStopped) {
		return flow.Delivered{Stopped: true}
	}
	return flow.Delivered{Err: err}
}

// peerRoles are the roles whose workers' caches a prefilling worker may
// pull a prefix from: any worker that keeps prompts.
var peerRoles = []control.Role{control.RolePrefill, control.RoleDecode, control.RoleColocated}

// pullPrefix returns the PeerPrefix of the router's pull p for worker
// puller (nil for none, or when p's worker is no longer a live member at
// its address): its address, role and tokens, with a credential for one
// pull from that peer, in its present start, by this worker, of exactly
// this prompt's chain (hashes): the puller holds no key, and the
// credential reads nothing else.
func (b *backend) pullPrefix(puller string, p router.Pull, hashes []uint64) *pdservev1.PeerPrefix {
	if p.From.ID == "" || len(hashes) == 0 {
		return nil
	}
	for _, hb := range b.members.All() {
		if hb.ID == p.From.ID && hb.GRPCAddr == p.From.Addr {
			return &pdservev1.PeerPrefix{Addr: hb.GRPCAddr, Id: hb.ID, Role: hb.Role, Tokens: int32(p.Tokens),
				Credential: b.auth.PullCredential(hb.ID, hb.BootEpoch, puller, hashes)}
		}
	}
	return nil
}

// migrateFrom returns the PeerPrefix of decode worker w, which moved
// request id out and holds its KV for the pull of the worker puller (a
// live migration): its address, id and role (for the pull's TLS checks)
// and, with a signing key, a credential for that one sequence
// (grpcauth.MigrateCredential), as a live member; gone from the
// membership, as last routed, without a credential (the pull then fails
// and the worker computes the KV).
func (b *backend) migrateFrom(w router.Worker, puller, id string) *pdservev1.PeerPrefix {
	for _, hb := range b.members.All() {
		if hb.ID == w.ID && hb.GRPCAddr == w.Addr {
			return &pdservev1.PeerPrefix{Addr: hb.GRPCAddr, Id: hb.ID, Role: hb.Role,
				Credential: b.auth.MigrateCredential(hb.ID, hb.BootEpoch, puller, id)}
		}
	}
	return &pdservev1.PeerPrefix{Addr: w.Addr, Id: w.ID}
}

// clientError maps a failed request's error to what the client is told:
// a flow.Failure of a kind the client can act on gets the OpenAI-shaped
// frontend.Error of its kind (wrapped beside it, so the log keeps the
// cause); any other error is returned unchanged (an internal one, or the
// shell's own: the client's context, a write that failed).
func clientError(err error, req *frontend.Request) error {
	var f *flow.Failure
	if !errors.As(err, &f) {
		return err
	}
	var fe error
	switch f.Kind {
	case flow.KindInvalid:
		fe = frontend.NewError(frontend.ErrInvalid, "invalid_request", "", "The %s worker cannot serve the request as asked.", f.Part)
	case flow.KindOverloaded:
		fe = frontend.NewError(frontend.ErrOverloaded, "overloaded", "", "The %s workers have no room for the request now (queue full); retry later.", f.Part)
	case flow.KindUnavailable:
		fe = frontend.NewError(frontend.ErrUnavailable, "unavailable", "", "The %s worker is unavailable; retry later.", f.Part)
	case flow.KindNoKVRoom:
		fe = frontend.NewError(frontend.ErrOverloaded, "overloaded", "",
			"No decode worker has free KV cache for %d tokens now; retry later.", len(req.Prompt)+req.MaxTokens*max(req.N, 1))
	case flow.KindQueuesFull:
		fe = frontend.NewError(frontend.ErrOverloaded, "overloaded", "", "Every prefill worker's queue is full; retry later.")
	case flow.KindNoWorkers:
		fe = frontend.NewError(frontend.ErrUnavailable, "no_workers", "", "No worker serving model %q can take the request now; retry later.", req.Model)
	case flow.KindDecodeFailed:
		fe = frontend.NewError(frontend.ErrUnavailable, "decode_failed", "", "The request failed on %d decode workers in turn; retry later.", flow.MaxRecoveries+1)
	case flow.KindNotRecovered:
		fe = frontend.NewError(frontend.ErrUnavailable, "decode_failed", "",
			"The decode worker serving the request failed and no other decode worker could take it; retry later.")
	default:
		return err
	}
	return fmt.Errorf("%w: %w", err, fe)
}
