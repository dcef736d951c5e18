package region

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/grpcnet"
)

// The headers between the coordinators of two regions. A coordinator
// takes them only on its region listener, from a peer whose certificate
// the region CA signed; a client's own are ignored.
const (
	// HeaderHop counts the forwards a request took; a forwarded request
	// (1) is served where it arrived, never forwarded again.
	HeaderHop = "X-PDServe-Region-Hop"
	// HeaderOrigin names the region whose coordinator the client called.
	HeaderOrigin = "X-PDServe-Origin-Region"
	// HeaderKey is the name of the API key the origin authenticated and
	// charged ("" without keys): the peer applies that key's policies.
	HeaderKey = "X-PDServe-Region-Key"
	// HeaderTenant is the client's prefix-cache partition (secret: it
	// travels only over the region's mutual TLS).
	HeaderTenant = "X-PDServe-Region-Tenant"
	// HeaderRTT is the round trip the origin measured to this region, ms.
	HeaderRTT = "X-PDServe-Region-RTT-Ms"
	// HeaderServed, on a response, names the region that served it.
	HeaderServed = "X-PDServe-Region"
	// HeaderUsage, a trailer of a forwarded response, is the tokens the
	// request used where it was served (prompt, output delivered,
	// grammar; 0 when refused there): the origin settles the key's
	// tokens a minute to it. The serving region charges nothing.
	HeaderUsage = "X-PDServe-Region-Usage"
	// headerTTFTBudget is the TTFT budget left for the peer, ms: the
	// frontend's objective header (frontend.HeaderTTFTBudget).
	headerTTFTBudget = "X-PDServe-TTFT-Budget-Ms"
)

// MinForwardBudget is the budget sent with a request forwarded after
// its own budget was spent (Request.Fallback): the least the budget
// header carries, so that the peer picks whatever serves soonest.
const MinForwardBudget = time.Microsecond

// MaxHops is the most forwards of one request.
const MaxHops = 1

// Forward timeouts: a peer that does not accept a connection within
// dialTimeout (a coordinator down, a link cut) is passed over for the
// next; so is one that does not finish the TLS handshake in time.
const (
	dialTimeout      = time.Second
	handshakeTimeout = time.Second
	// pingAfter and pingTimeout are the HTTP/2 health check of a
	// connection to a peer: a ping after pingAfter without a frame,
	// the connection closed when its answer takes over pingTimeout.
	pingAfter   = time.Second
	pingTimeout = 2 * time.Second
	// maxBufferedBody bounds a non-streamed response held before it is
	// written to the client.
	maxBufferedBody = 64 << 20
)

// Request is what the origin forwards with a request's body.
type Request struct {
	// Path is the route (/v1/chat/completions or /v1/completions).
	Path string
	// Key and Tenant are the client's identity (HeaderKey, HeaderTenant).
	Key, Tenant string
	// TTFTBudget and Priority are the request's objective, as the origin
	// resolved it: TTFTBudget is the client's whole budget (0: none),
	// and the peer gets what is left of it (Left), so that it plans
	// against that, not the whole (its own key's policy then caps the
	// priority again).
	TTFTBudget time.Duration
	Priority   string
	// Network is the part of the budget spent on the client's network
	// (its round trip to the origin; 0: not measured), Arrival when the
	// origin got the request: the time since is spent too.
	Network time.Duration
	Arrival time.Time
	// Fallback forwards the request even once its budget is spent: the
	// origin cannot serve it at all, and late beats never. Without it a
	// spent budget ends the forwarding (Outcome.Spent), since no region
	// can meet it and the origin serves it without a round trip more.
	Fallback bool
	// OnUsage, when not nil, is called once with the serving region's
	// count of the tokens the request used (the HeaderUsage trailer)
	// when its response ended with one, before the end of the response
	// reaches the client.
	OnUsage func(tokens int)
	// Header are the client's headers passed on (Content-Type, Accept,
	// traceparent), the others dropped.
	Header http.Header
}

// Left returns what is left at now of the request's TTFT budget for a
// region at round trip rtt: the budget less the client's network term,
// the time since Arrival and rtt; ≤ 0 when spent. Meaningless without a
// budget (TTFTBudget 0).
func (r Request) Left(now time.Time, rtt time.Duration) time.Duration {
	tr := budget.Trace{Arrival: r.Arrival, ClientRTT: r.Network, Objective: budget.Objective{TTFTBudget: r.TTFTBudget}}
	left, _ := tr.BudgetLeft(now)
	return left - max(rtt, 0)
}

// Forwarder forwards requests to peer regions over mutual TLS.
type Forwarder struct {
	name   string
	client *http.Client
	log    *zap.Logger
	// now is the clock of the budget's time spent (time.Now).
	now func() time.Time
}

// NewForwarder returns the forwarder of region name: its client presents
// t's certificate and verifies peers against t's CA.
func NewForwarder(name string, t *grpcnet.TLS, log *zap.Logger) *Forwarder {
	if log == nil {
		log = zap.NewNop()
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 15 * time.Second}).DialContext,
		TLSClientConfig:     t.ClientConfig(),
		TLSHandshakeTimeout: handshakeTimeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// A pooled connection over a link that went dead (cut, no RST)
		// would hold a request until TCP gives up: a ping after
		// pingAfter of silence, unanswered for pingTimeout, closes it,
		// and a request not yet answered goes to the next region.
		HTTP2: &http.HTTP2Config{SendPingTimeout: pingAfter, PingTimeout: pingTimeout},
	}
	return &Forwarder{name: name, client: &http.Client{Transport: tr}, log: log, now: time.Now}
}

// Close closes the idle connections.
func (f *Forwarder) Close() { f.client.CloseIdleConnections() }

// Outcome is how a forward ended.
type Outcome struct {
	// Region served the request (its response reached the client, whole
	// or cut); "" when no peer took it and nothing was written.
	Region string
	// Status is the peer's HTTP status.
	Status int
	// Tried are the regions that refused or could not be reached, each
	// with why.
	Tried []string
	// Err is why a started response was cut (the peer or the link failed
	// mid-response); the client saw a clear error, never a second answer.
	Err error
	// Spent: the request's budget was spent before a peer took it, and
	// the forwarding stopped there (Region "", nothing written).
	Spent bool
	// Usage is the serving region's count of the tokens the request
	// used (HeaderUsage), -1 when its response came without one.
	Usage int
}

// retryable reports whether a peer's status means it did not take the
// request: it is busy or has no workers, so another region may.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusBadGateway ||
		status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

// Forward sends the request to cands in order until one takes it, and
// copies that one's response to w. A peer that cannot be reached (the
// request was not written to it), or answers with a status that means it
// did not take the request (429, 502, 503, 504), is passed over before
// anything is written, and so is a peer that closed the connection after
// it was sent the request (its process died, or its server closed the
// connection and with it cancelled the request). A peer that was sent
// the whole request and went silent before its answer (a link cut under
// it: the health check's ping went unanswered) may be running it: the
// request goes nowhere else and fails with a 502 that says so, as it
// would once a peer's response started, which is the answer: a failure then
// ends the response with a clear error (an error event in a stream, a
// 502 for a whole response not yet written). With no peer taking it,
// Outcome.Region is "" and w is untouched.
//
// Each peer gets what is left of the request's TTFT budget when it is
// tried (Request.Left: the time spent at the origin, a peer that failed
// before included, and the round trip to it taken off). Once nothing is
// left for a peer, the forwarding stops there (Outcome.Spent) unless
// req.Fallback, which sends it with MinForwardBudget.
func (f *Forwarder) Forward(ctx context.Context, w http.ResponseWriter, body []byte, req Request, cands []Candidate) Outcome {
	out := Outcome{Usage: -1}
	for _, c := range cands {
		left := time.Duration(0) // no budget
		if req.TTFTBudget > 0 {
			if left = req.Left(f.now(), c.RTT); left <= 0 {
				if !req.Fallback {
					out.Spent = true
					out.Tried = append(out.Tried, c.Region+": TTFT budget spent")
					return out
				}
				left = MinForwardBudget
			}
		}
		resp, sent, err := f.send(ctx, c, body, req, left)
		if err != nil {
			if ctx.Err() != nil {
				out.Err = ctx.Err()
				return out // the client went away
			}
			if sent && peerSilent(err) {
				w.Header().Set(HeaderServed, c.Region) // where it may have run
				writeJSONError(w, http.StatusBadGateway, "The region "+c.Region+" was sent this request and failed before answering; it was not retried elsewhere (it may have run there).")
				out.Region, out.Status, out.Err = c.Region, http.StatusBadGateway, fmt.Errorf("region %s: no answer to the request sent: %w", c.Region, err)
				return out
			}
			out.Tried = append(out.Tried, c.Region+": "+err.Error())
			continue
		}
		if retryable(resp.StatusCode) {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			out.Tried = append(out.Tried, c.Region+": HTTP "+strconv.Itoa(resp.StatusCode))
			continue
		}
		out.Region, out.Status = c.Region, resp.StatusCode
		out.Err = f.copy(w, resp, c.Region, func() {
			out.Usage = usageTrailer(resp.Trailer)
			if out.Usage >= 0 && req.OnUsage != nil {
				req.OnUsage(out.Usage)
			}
		})
		_ = resp.Body.Close()
		return out
	}
	return out
}

// maxUsage bounds a peer's usage count: more than any request's tokens.
const maxUsage = 1 << 40

// usageTrailer returns the HeaderUsage trailer, -1 when absent or not a
// count.
func usageTrailer(t http.Header) int {
	n, err := strconv.ParseInt(strings.TrimSpace(t.Get(HeaderUsage)), 10, 64)
	if err != nil || n < 0 || n > maxUsage {
		return -1
	}
	return int(n)
}

// peerSilent reports whether err is the peer's silence after it was sent
// the request: the connection's health-check ping went unanswered (a cut
// link; net/http's HTTP/2 transport reports "client connection lost",
// which it does not export) or a timeout. The peer may still be running
// the request then. Any other error is the peer closing or refusing (EOF,
// reset, GOAWAY, a stream reset, a refused redial: its process or server
// went away and took the request with it), after which another region
// may serve it.
func peerSilent(err error) bool {
	var ne net.Error
	return strings.Contains(err.Error(), "client connection lost") || errors.As(err, &ne) && ne.Timeout()
}

// send posts the request to c with the TTFT budget left (0: none); sent
// reports whether the whole request was written to a connection to c
// (then c may have it, even when err is not nil).
func (f *Forwarder) send(ctx context.Context, c Candidate, body []byte, req Request, left time.Duration) (_ *http.Response, sent bool, _ error) {
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			wrote.Store(true)
		}
	}})
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.URL, "/")+req.Path, bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	for _, h := range []string{"Content-Type", "Accept", "Traceparent", "Tracestate"} {
		if v := req.Header.Get(h); v != "" {
			hr.Header.Set(h, v)
		}
	}
	hr.Header.Set(HeaderHop, "1")
	hr.Header.Set(HeaderOrigin, f.name)
	hr.Header.Set(HeaderKey, req.Key)
	hr.Header.Set(HeaderTenant, req.Tenant)
	if c.RTT > 0 {
		hr.Header.Set(HeaderRTT, strconv.FormatFloat(float64(c.RTT.Microseconds())/1000, 'f', 3, 64))
	}
	if left > 0 {
		hr.Header.Set(headerTTFTBudget, strconv.FormatFloat(float64(max(left, MinForwardBudget).Microseconds())/1000, 'f', 3, 64))
	}
	if req.Priority != "" {
		hr.Header.Set("X-PDServe-Priority", req.Priority)
	}
	resp, err := f.client.Do(hr)
	return resp, wrote.Load(), err
}

// hopByHop are the response headers not copied.
var hopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Transfer-Encoding": true, "Content-Length": true, "Trailer": true, "Upgrade": true}

// done is the event that ends a stream.
var done = []byte("data: [DONE]\n\n")

// copy writes resp to w: a stream as it comes, flushed event by event;
// a whole response once it arrived whole. ended is called once resp's
// body was read to its end (its trailers are in), before the end reaches
// the client: before a whole response is written, and, of a stream,
// before its closing [DONE] event when that comes last in a read.
func (f *Forwarder) copy(w http.ResponseWriter, resp *http.Response, region string, ended func()) error {
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	header := func() {
		for k, vs := range resp.Header {
			if !hopByHop[k] {
				w.Header()[k] = vs
			}
		}
		w.Header().Set(HeaderServed, region)
	}
	if !stream {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxBufferedBody+1))
		if err == nil && len(b) > maxBufferedBody {
			err = fmt.Errorf("response over %d bytes", maxBufferedBody)
		}
		if err != nil {
			writeJSONError(w, http.StatusBadGateway, "The region "+region+" serving this request failed before its response was complete; it was not retried elsewhere (it may have run there).")
			return fmt.Errorf("region %s: response: %w", region, err)
		}
		ended()
		header()
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(b)
		return nil
	}
	header()
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	buf := make([]byte, 32<<10)
	var held []byte // the closing [DONE], written once the body ended
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			out := buf[:n]
			if held != nil { // more after [DONE]: it was not the end
				out = append(append([]byte(nil), held...), out...)
				held = nil
			}
			if bytes.HasSuffix(out, done) {
				out, held = out[:len(out)-len(done)], done
			}
			if len(out) > 0 {
				if _, werr := w.Write(out); werr != nil {
					return werr // the client went away: the peer's stream is cancelled with its context
				}
				_ = rc.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			ended()
			if held != nil {
				if _, werr := w.Write(held); werr != nil {
					return werr
				}
				_ = rc.Flush()
			}
			return nil
		}
		if err != nil && held != nil {
			// The stream was whole, its trailer lost: the client gets its
			// end, and the charge stands (no usage).
			if _, werr := w.Write(held); werr != nil {
				return werr
			}
			_ = rc.Flush()
			return nil
		}
		if err != nil {
			// An SSE event of its own (a blank line first ends a partial
			// one): the client sees the stream fail, not end.
			ev, _ := json.Marshal(map[string]any{"error": map[string]any{
				"message": "The region " + region + " serving this request failed mid-stream; the request was not retried elsewhere.",
				"type":    "server_error", "code": "region_failed",
			}})
			_, _ = fmt.Fprintf(w, "\n\ndata: %s\n\n", ev)
			_ = rc.Flush()
			return fmt.Errorf("region %s: stream cut: %w", region, err)
		}
	}
}

// writeJSONError writes an OpenAI-shaped error.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "server_error", "code": "region_failed", "param": nil}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// ServerTLS returns the TLS configuration of the region listener: the
// region certificate, client certificates required and verified against
// the region CA.
func ServerTLS(t *grpcnet.TLS) *tls.Config { return t.ServerConfig() }
