package frontend

import (
	"context"
	"crypto/sha256"
	"net/http"
	"time"

	"github.com/pdserve/pdserve/pkg/budget"
)

// Regions places requests across the regions of a federation (package
// region, behind the coordinator): a request this region should not
// serve goes to another region's coordinator over the OpenAI API.
type Regions interface {
	// Forward serves the request elsewhere when this region should not
	// (region.Place): it returns the region that answered (its response
	// written to w, whole, or cut with a clear error), or Region "" with
	// nothing written, to serve (or refuse) the request here.
	Forward(w http.ResponseWriter, r *http.Request, body []byte, f Forwardable) Forwarded
}

// Forwardable is a request the frontend asks Regions to place.
type Forwardable struct {
	// Route is the API route; Model the model or tier alias the client
	// named ("" for the default).
	Route, Model string
	// Served is the model that would serve it here ("" when none is up
	// here: the request cannot be served here).
	Served       string
	PromptTokens int
	// Objective is the request's, its TTFT budget the client's whole
	// budget; Arrival is when this coordinator got the request and
	// ClientRTT the client's network term (0: not measured): what is
	// left of the budget for another region is the budget less both
	// (budget.Trace.BudgetLeft) and the round trip to that region.
	Objective budget.Objective
	Arrival   time.Time
	ClientRTT time.Duration
	// Key and Tenant are the client's identity: its API key's name ("":
	// none) and prefix-cache partition.
	Key, Tenant string
	// Settle, when not nil, is called at most once, with the tokens the
	// request used as the serving region counted them (prompt, output
	// delivered, grammar), when its response ended with that count and
	// before the end reaches the client: the origin gives back the
	// unused part of the key's tokens a minute it took (or, for a request
	// it could not count before, no model of it being served here,
	// charges what it used). Not called when the count did not come (a
	// response cut midway): the charge stands.
	Settle func(used int)
}

// Forwarded is a request another region's coordinator forwarded here, as
// the coordinator's region listener verified it (mutual TLS with the
// region CA), or, from Regions.Forward, where a request was forwarded.
type Forwarded struct {
	// Region is the region that served it (from Forward), Origin the
	// region whose coordinator the client called.
	Region, Origin string
	// Key and Tenant are the client's identity, as the origin
	// authenticated it: the request has that key's policies here (the
	// origin charged its rate limits, and settles them with Usage; this
	// region charges nothing).
	Key, Tenant string
	// Usage, when not nil, is given the tokens the forwarded request
	// used (prompt, output delivered, grammar; 0 when refused here)
	// before its handler returns, for the origin's settlement: the
	// coordinator's region listener sends it as a trailer. Called from
	// the request's handler goroutine, possibly more than once (the last
	// count holds).
	Usage func(tokens int)
	// RTT is the round trip between the origin and this region.
	RTT time.Duration
	// Status is the HTTP status the serving region answered (Forward).
	Status int
	// Err is why a response started elsewhere was cut (Forward).
	Err error
}

type forwardedCtx struct{}

// WithForwarded returns ctx marking its request as forwarded by a peer
// region's coordinator: ServeHTTP then takes the identity from f instead
// of authenticating an API key, and never forwards it again. Only the
// coordinator's region listener, after mutual TLS, sets it.
func WithForwarded(ctx context.Context, f Forwarded) context.Context {
	return context.WithValue(ctx, forwardedCtx{}, &f)
}

// used reports the tokens a forwarded request used (f.Usage); nothing
// for a request a client sent here (f nil).
func (f *Forwarded) used(tokens int) {
	if f != nil && f.Usage != nil {
		f.Usage(tokens)
	}
}

// forwardedOf returns r's forwarding, nil when a client called here.
func forwardedOf(r *http.Request) *Forwarded {
	f, _ := r.Context().Value(forwardedCtx{}).(*Forwarded)
	return f
}

// tenantDigest is a forwarded client's response cache partition.
func tenantDigest(tenant string) []byte {
	d := sha256.Sum256([]byte("tenant\x00" + tenant))
	return d[:]
}
