package frontend

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/apikey"
	"github.com/pdserve/pdserve/pkg/config"
)

// OpenAI's messages of a 401.
const (
	msgNoKey  = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	msgBadKey = "Incorrect API key provided. Ask the operator of this server for a valid key."
	// The Messages API's, as Anthropic words them.
	msgNoKeyAnthropic  = "x-api-key header is required"
	msgBadKeyAnthropic = "invalid x-api-key"
)

// keyCtx is the context key of a request's *apikey.Key.
type keyCtx struct{}

// keyOf returns the key r was authenticated with, nil without
// authentication.
func keyOf(r *http.Request) *apikey.Key {
	k, _ := r.Context().Value(keyCtx{}).(*apikey.Key)
	return k
}

// authenticates reports whether path needs an API key: the whole /v1/
// API, not /healthz, /readyz nor /metrics (which has a token of its
// own).
func authenticates(path string) bool { return path == "/v1" || strings.HasPrefix(path, "/v1/") }

// authenticate returns r with its key in its context, or writes the 401
// and logs the refusal and returns nil.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) *http.Request {
	presented, given := credentials(r)
	if k := s.o.APIKeys.Authenticate(presented); given && k != nil {
		return r.WithContext(context.WithValue(r.Context(), keyCtx{}, k))
	}
	msg, reason := msgBadKey, "invalid_api_key"
	fields := []zap.Field{zap.String("api_key", "unknown key")}
	if !given {
		msg, reason = msgNoKey, "missing_api_key"
		fields = []zap.Field{zap.String("api_key", "none")}
	} else {
		fields = append(fields, zap.String("api_key_sha256", apikey.DigestPrefix(apikey.Hash(presented))))
	}
	s.o.Logger.Warn("request refused", append(fields, zap.Int("http_status", http.StatusUnauthorized), zap.String("reason", reason),
		zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.String("remote_addr", r.RemoteAddr))...)
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close") // the body stays unread
	}
	aerr := &apiError{status: http.StatusUnauthorized, Message: msg, Type: "invalid_request_error", Code: ptr("invalid_api_key")}
	if r.URL.Path == RouteMessages {
		aerr.Message = msgBadKeyAnthropic
		if !given {
			aerr.Message = msgNoKeyAnthropic
		}
		s.writeMsgError(w, aerr, "")
		return nil
	}
	writeError(w, aerr, 0)
	return nil
}

// metricsAuth guards h with Options.MetricsToken.
func (s *Server) metricsAuth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		presented, given := bearer(r)
		if s.o.MetricsToken.Check(presented) && given {
			h.ServeHTTP(w, r)
			return
		}
		fields := []zap.Field{zap.Int("http_status", http.StatusUnauthorized), zap.String("path", r.URL.Path), zap.String("remote_addr", r.RemoteAddr)}
		if given {
			fields = append(fields, zap.String("reason", "invalid_token"), zap.String("token_sha256", apikey.DigestPrefix(apikey.Hash(presented))))
		} else {
			fields = append(fields, zap.String("reason", "missing_token"))
		}
		s.o.Logger.Warn("metrics request refused", fields...)
		w.Header().Set("WWW-Authenticate", `Bearer realm="metrics"`)
		http.Error(w, "unauthorized: /metrics needs Authorization: Bearer with the metrics token", http.StatusUnauthorized)
	})
}

// credentials returns the API key r presents, as "Authorization: Bearer"
// or, as Anthropic's clients send it, "x-api-key", and whether it
// presents one.
func credentials(r *http.Request) (string, bool) {
	if k, ok := bearer(r); ok {
		return k, true
	}
	k := strings.TrimSpace(r.Header.Get("x-api-key"))
	return k, k != ""
}

// bearer returns the credentials of an "Authorization: Bearer" header
// (the scheme in any case) and whether there were any.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if len(h) < len("Bearer ") || !strings.EqualFold(h[:len("Bearer ")], "Bearer ") {
		return "", false
	}
	k := strings.TrimSpace(h[len("Bearer "):])
	return k, k != ""
}

// client is who sent a request: its authenticated key, or without
// authentication the key it sent, if any (which only selects a budget).
type client struct {
	key *apikey.Key
	raw string
	// fwd is the identity a peer region's coordinator forwarded (key nil
	// then): its key's name selects policies, its tenant the partitions.
	fwd *Forwarded
	// retry is how many times the client says it sent this request
	// before (retryOf).
	retry int
}

// HeaderRetryCount is the header in which the OpenAI and Anthropic SDKs
// (and other clients their generator makes) say which retry of a request
// this is: 0 on the first try, then 1, 2, ... as they retry a 429, a 5xx
// or a broken connection.
const HeaderRetryCount = "X-Stainless-Retry-Count"

// retryOf returns r's X-Stainless-Retry-Count: 0 when absent, or when it
// is not a whole number from 0 to 100.
func retryOf(r *http.Request) int {
	n, err := strconv.Atoi(r.Header.Get(HeaderRetryCount))
	if err != nil || n < 0 || n > 100 {
		return 0
	}
	return n
}

// keyName returns the name of the client's key and whether it has one
// (authenticated here, or by the origin of a forwarded request).
func (c client) keyName() (string, bool) {
	switch {
	case c.key != nil:
		return c.key.Name, true
	case c.fwd != nil && c.fwd.Key != "":
		return c.fwd.Key, true
	}
	return c.raw, false
}

// budget returns the prompt budget of the client's request on route and
// its surface (see config.Budgets).
func (c client) budget(b config.Budgets, route string) (int, string) {
	if name, ok := c.keyName(); ok {
		return b.NamedBudget(route, name)
	}
	return b.Budget(route, c.raw)
}

// tenant returns the client's prefix-cache partition (Request.Tenant).
func (c client) tenant() string {
	if c.fwd != nil {
		return c.fwd.Tenant
	}
	if c.key == nil {
		return ""
	}
	return c.key.Tenant()
}

// fields returns the request log's fields of the client: the key's name.
func (c client) fields() []zap.Field {
	if name, ok := c.keyName(); ok {
		return []zap.Field{zap.String("api_key", name)}
	}
	return nil
}

// rateLimitHeaders sets OpenAI's x-ratelimit-* headers of the key's
// limits (those of a limit the key does not have are left out).
func rateLimitHeaders(h http.Header, q apikey.Quota) {
	for _, l := range []struct {
		name string
		w    apikey.Window
	}{{apikey.Requests, q.Requests}, {apikey.Tokens, q.Tokens}} {
		if l.w.Limit == 0 {
			continue
		}
		h.Set("x-ratelimit-limit-"+l.name, strconv.Itoa(l.w.Limit))
		h.Set("x-ratelimit-remaining-"+l.name, strconv.Itoa(l.w.Remaining))
		h.Set("x-ratelimit-reset-"+l.name, formatReset(l.w.Reset))
	}
}

// formatReset formats a reset time as OpenAI does: a Go duration of whole
// milliseconds ("0s", "20ms", "1.5s", "6m0s").
func formatReset(d time.Duration) string { return d.Round(time.Millisecond).String() }

// rateLimited is the 429 of a refused take of key.
func rateLimited(key *apikey.Key, q apikey.Quota) *apiError {
	w, unit := q.Requests, "requests per min (RPM)"
	if q.Exceeded == apikey.Tokens {
		w, unit = q.Tokens, "tokens per min (TPM)"
	}
	e := &apiError{status: http.StatusTooManyRequests, Type: q.Exceeded, Code: ptr("rate_limit_exceeded"), retryAfter: q.RetryAfter}
	if q.RetryAfter == 0 {
		// It can never succeed as it is: no Retry-After, or SDKs retry it
		// forever (OpenAI's "Request too large" sends none either).
		e.noRetry = true
		e.Message = fmt.Sprintf("Request too large for API key %s on %s: Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.",
			key.Name, unit, w.Limit, q.Requested)
	} else {
		e.Message = fmt.Sprintf("Rate limit reached for API key %s on %s: Limit %d, Used %d, Requested %d. Please try again in %s.",
			key.Name, unit, w.Limit, w.Limit-w.Remaining, q.Requested, formatReset(q.RetryAfter))
	}
	return e
}
