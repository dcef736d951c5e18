package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
)

// Errors a Backend wraps to choose the HTTP status; match with errors.Is.
// The text of an error wrapping one of them never reaches the client: it
// gets a generic message of the kind (see the package doc) and the error
// goes to the request log. Use NewError for a message meant for the
// client.
var (
	// ErrOverloaded: no capacity now (all workers full): 429.
	ErrOverloaded = errors.New("overloaded")
	// ErrUnavailable: no worker can serve the request: 503.
	ErrUnavailable = errors.New("unavailable")
	// ErrInvalid: the request cannot be served as asked: 400.
	ErrInvalid = errors.New("invalid request")
	// ErrStopped is returned by an EmitFunc when a stop string matched in
	// a choice; the Backend must end that choice (with finish "stop") and
	// go on with the others.
	ErrStopped = errors.New("stop string matched")
)

// Error is an error whose message, code and param are meant for the
// client, as a Backend returns it (see NewError). It wraps its Kind, so
// errors.Is(err, ErrOverloaded) and the like still hold.
type Error struct {
	// Kind is ErrOverloaded (429), ErrUnavailable (503), ErrInvalid (400),
	// or anything else (500).
	Kind error
	// Code and Param are the error's "code" and "param"; "" sends null.
	Code, Param string
	// Message is sent to the client as it is.
	Message string
}

// NewError returns an *Error of kind with a client-facing message
// (fmt.Sprintf(format, args...)), code and param (either "" for null).
// The message must hold nothing internal (no worker addresses, no error
// text from below): it is sent as it is. To keep an internal cause for
// the request log, wrap the result: fmt.Errorf("op: %v: %w", cause, e)
// logs the whole chain and sends only e's message.
func NewError(kind error, code, param, format string, args ...any) error {
	return &Error{Kind: kind, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

// apiError is an OpenAI-shaped error as the client sees it.
type apiError struct {
	status  int
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
	// cause is the internal error behind e, for the request log only:
	// never sent to the client.
	cause error
	// retryAfter, when > 0, is the Retry-After of this 429 (a rate
	// limit's wait) instead of Options.RetryAfter.
	retryAfter time.Duration
	// noRetry: no Retry-After, even on a 429 (a request that can never
	// succeed as it is, such as one over a key's whole limit).
	noRetry bool
}

func (e *apiError) Error() string { return e.Message }

func ptr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// badRequest returns a 400 invalid_request_error about param.
func badRequest(param, code, format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, Message: fmt.Sprintf(format, a...),
		Type: "invalid_request_error", Param: ptr(param), Code: ptr(code)}
}

// unsupported returns the 400 of a parameter pdserve does not implement
// with that value.
func unsupported(param, format string, a ...any) *apiError {
	return badRequest(param, "unsupported_value", format, a...)
}

// overloaded is the 429 of a full server.
func overloaded(format string, a ...any) *apiError {
	return &apiError{status: http.StatusTooManyRequests, Message: fmt.Sprintf(format, a...), Type: "rate_limit_error", Code: ptr("overloaded")}
}

// statusClientClosed is the status logged when the client went away
// (nginx's 499); the client never sees it.
const statusClientClosed = 499

// cancelled is the log entry of a request whose client went away.
func cancelled(cause error) *apiError {
	return &apiError{status: statusClientClosed, Message: "cancelled", Type: "cancelled", cause: cause}
}

// backendError maps a Backend error of the request with id to what the
// client sees: an *Error as it is, else a generic message per kind, the
// error itself kept as the cause for the log.
func backendError(err error, id string) *apiError {
	var fe *Error
	var ae *apiError
	var out *apiError
	switch {
	case errors.As(err, &ae):
		return ae // the frontend's own (emit)
	case errors.As(err, &fe):
		out = kindError(fe.Kind, fe.Message, id)
		out.Code, out.Param = ptr(fe.Code), ptr(fe.Param)
	default:
		out = kindError(err, "", id)
	}
	out.cause = err
	return out
}

// kindError returns the error of err's kind with msg, or the kind's
// generic message when msg is "".
func kindError(err error, msg, id string) *apiError {
	or := func(generic string) string {
		if msg != "" {
			return msg
		}
		return generic
	}
	switch {
	case errors.Is(err, ErrOverloaded):
		return overloaded("%s", or("The server is overloaded; retry later."))
	case errors.Is(err, ErrUnavailable):
		return &apiError{status: http.StatusServiceUnavailable, Message: or("No worker can serve the request now; retry later."),
			Type: "service_unavailable", Code: ptr("unavailable")}
	case errors.Is(err, ErrInvalid):
		return &apiError{status: http.StatusBadRequest, Message: or("The request cannot be served as asked; see the server log for request " + id + "."),
			Type: "invalid_request_error", Code: ptr("invalid_request")}
	default:
		return &apiError{status: http.StatusInternalServerError, Message: or("internal error; see the server log for request " + id),
			Type: "server_error", Code: ptr("internal_error")}
	}
}

// writeError writes e as the whole response; retryAfter (or e's own) is
// sent with 429 and 503 (rounded up to whole seconds, at least 1) unless
// e.noRetry.
func writeError(w http.ResponseWriter, e *apiError, retryAfter time.Duration) {
	if e.retryAfter > 0 {
		retryAfter = e.retryAfter
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	if (e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable) && !e.noRetry {
		h.Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(retryAfter.Seconds())))))
	}
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e}) // the client may be gone; nothing to do about it
}

// traceStatus is the budget status of a request that ended with e: 429
// rejected, 503 unavailable, a client that closed the connection
// cancelled, another 4xx invalid, 5xx an error.
func (e *apiError) traceStatus() string {
	switch {
	case e.status == http.StatusTooManyRequests:
		return budget.StatusRejected
	case e.status == http.StatusServiceUnavailable:
		return budget.StatusUnavailable
	case e.status == statusClientClosed:
		return budget.StatusCancelled
	case e.status < 500:
		return budget.StatusInvalid
	}
	return budget.StatusError
}
