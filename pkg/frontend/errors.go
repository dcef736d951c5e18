package frontend

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Errors a Backend wraps to choose the HTTP status; match with errors.Is.
var (
	// ErrOverloaded: no capacity now (queue limit, all workers full): 429.
	ErrOverloaded = errors.New("overloaded")
	// ErrUnavailable: no worker can serve the request: 503.
	ErrUnavailable = errors.New("unavailable")
	// ErrInvalid: the request cannot be served as asked: 400.
	ErrInvalid = errors.New("invalid request")
	// ErrStopped is returned by an EmitFunc when a stop string matched; the
	// Backend must stop generating and return it (wrapped).
	ErrStopped = errors.New("stop string matched")
)

// apiError is an OpenAI-shaped error.
type apiError struct {
	status  int
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
	// cause is the internal error behind e, for the request log only:
	// never sent to the client.
	cause error
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

// backendError maps a Backend error to an apiError.
func backendError(err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, ErrOverloaded):
		return &apiError{status: http.StatusTooManyRequests, Message: err.Error(), Type: "rate_limit_error", Code: ptr("overloaded")}
	case errors.Is(err, ErrUnavailable):
		return &apiError{status: http.StatusServiceUnavailable, Message: err.Error(), Type: "service_unavailable", Code: ptr("no_workers")}
	case errors.Is(err, ErrInvalid):
		return &apiError{status: http.StatusBadRequest, Message: err.Error(), Type: "invalid_request_error"}
	default:
		return &apiError{status: http.StatusInternalServerError, Message: err.Error(), Type: "server_error"}
	}
}

// writeError writes e as the whole response; retryAfter is sent with 429
// and 503 (rounded up to whole seconds, at least 1).
func writeError(w http.ResponseWriter, e *apiError, retryAfter time.Duration) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	if e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable {
		h.Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(retryAfter.Seconds())))))
	}
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e}) // the client may be gone; nothing to do about it
}
