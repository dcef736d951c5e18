package wire

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Details of a KV transfer failure: the status of a Prefill or Resend call
// whose transfer to the decode worker failed carries an
// errdetails.ErrorInfo with this reason and domain, and the decode
// worker's address as metadata "decode_addr". The values are part of the
// wire protocol between the prefill workers and the coordinator.
const (
	ErrorDomain           = "prefill.pdserve"
	ErrorReasonKVTransfer = "KV_TRANSFER_FAILED"
)

// KVTransferFailedStatus turns the error of a transfer of request id to the decode
// worker at addr into the gRPC status error the prefill worker returns:
// the decode worker's code when it sent one, CANCELED for a cancellation,
// UNAVAILABLE otherwise; marked so that IsKVTransferFailed reports it.
func KVTransferFailedStatus(id, addr string, err error) error {
	code := codes.Unavailable
	switch st, ok := status.FromError(err); {
	case ok && st.Code() != codes.Unknown && st.Code() != codes.OK:
		code = st.Code()
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	st := status.Newf(code, "prefill: kv transfer of %s to %s: %v", id, addr, err)
	if dst, derr := st.WithDetails(&errdetails.ErrorInfo{
		Reason: ErrorReasonKVTransfer, Domain: ErrorDomain, Metadata: map[string]string{"decode_addr": addr},
	}); derr == nil {
		st = dst
	}
	return st.Err()
}

// IsKVTransferFailed reports whether err (a gRPC status error of Prefill or
// Resend, possibly wrapped) says that the KV transfer to the decode worker
// failed, as opposed to the prefill worker itself: the decode worker was
// unreachable, refused the transfer (no reservation, ...) or ended it.
// Such errors are made by KVTransferFailedStatus.
func IsKVTransferFailed(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() == ErrorReasonKVTransfer {
			return true
		}
	}
	return false
}

// ErrorReasonGrammar marks (in an errdetails.ErrorInfo of domain
// ErrorDomain) the status of a Prefill or Generate call that ended because
// the request's grammar allows no token: every worker would end it the
// same way, so the coordinator ends the request instead of moving it.
const ErrorReasonGrammar = "GRAMMAR_ALLOWS_NO_TOKEN"

// GrammarRefusedStatus returns the FAILED_PRECONDITION status of a
// request whose grammar allows no token (fmt.Sprintf(format, args...)
// says which), marked so that IsGrammarRefused reports it.
func GrammarRefusedStatus(format string, args ...any) error {
	st := status.Newf(codes.FailedPrecondition, format, args...)
	if dst, err := st.WithDetails(&errdetails.ErrorInfo{Reason: ErrorReasonGrammar, Domain: ErrorDomain}); err == nil {
		st = dst
	}
	return st.Err()
}

// IsGrammarRefused reports whether err (a gRPC status error, possibly
// wrapped) was made by GrammarRefusedStatus.
func IsGrammarRefused(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() == ErrorReasonGrammar {
			return true
		}
	}
	return false
}
