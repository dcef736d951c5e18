package frontend

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/apikey"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/chattmpl"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/grammar"
	"github.com/pdserve/pdserve/pkg/metrics"
	"github.com/pdserve/pdserve/pkg/sampling"
	"github.com/pdserve/pdserve/pkg/tracing"
)

// Routes served by the frontend.
const (
	RouteCompletions = "/v1/completions"
	RouteChat        = "/v1/chat/completions"
	RouteModels      = "/v1/models"
)

// Request is a validated completion request handed to a Backend: one
// prompt (a batched /v1/completions request is one Request per prompt),
// N choices.
type Request struct {
	ID        string // unique, e.g. "cmpl-…"; also the id on the workers
	Route     string // RouteCompletions or RouteChat
	Model     string
	Prompt    []int32 // non-empty, ids within the vocabulary; read only
	MaxTokens int     // per choice, 1..cap
	// N is the number of choices (1..128) sampled from the one prompt;
	// they share the prompt's KV. Choice i samples with seed
	// Sampling.Seed + i.
	N int
	// Sampling of every choice. Sampling.Seed is the request's "seed", or
	// a random one (crypto/rand) when it gives none, so that unseeded
	// requests differ. Sampling.Penalties, when not nil, holds only the
	// presence and frequency penalties (no counts), owned by this Request:
	// the Backend keeps each choice's counts.
	Sampling  sampling.Sampling
	IgnoreEOS bool
	// Logprobs ≥ 0 asks for each output token's log-probability with that
	// many top alternatives (0..sampling.MaxTopLogprobs); -1: none.
	Logprobs int
	// PromptLogprobs ≥ 0 asks for the log-probability of every prompt
	// token after the first, with that many alternatives (echo with
	// logprobs); -1: none.
	PromptLogprobs int
	// Tenant is the request's prefix-cache partition: its API key's
	// (apikey.Key.Tenant: the key itself, or the tenant= its line
	// names); "" without API keys, one partition for every client. The
	// Backend roots the prompt's block hashes in it, so that a request
	// hits, and reports, only its own partition's cached prefixes.
	// Secret: never logged.
	Tenant string
	// Retry is how many times the client says it sent this request before
	// (X-Stainless-Retry-Count, HeaderRetryCount; 0 without it). The
	// coordinator's planner counts a refused request once, not once per
	// retry.
	Retry int
	// Trace is the request's budget, with Arrival, RequestID, Model and
	// PromptTokens set. The Backend fills worker boundaries and facts; the
	// frontend records tokens, the status and the finish. Owned by the
	// goroutine running Complete until it returns.
	Trace *budget.Trace
}

// Output is what a Backend hands the client in one EmitFunc call: new
// tokens of one choice, or the prompt's log-probabilities.
type Output struct {
	// Index is the choice, 0..N-1.
	Index int
	// Tokens are the choice's next output tokens (none when Prompt).
	Tokens []int32
	// Logprobs holds one entry per token of Tokens when
	// Request.Logprobs ≥ 0, else nil. With Prompt set it holds the
	// log-probabilities of prompt tokens 1..len(Prompt)-1 instead (the
	// first prompt token has none).
	Logprobs []sampling.TokenLogprob
	// Prompt marks the one Output carrying the prompt's logprobs, sent
	// before any token when Request.PromptLogprobs ≥ 0.
	Prompt bool
}

// EmitFunc hands output to the client, in order per choice. It must not
// be called concurrently nor after Complete returned. It returns an error
// when generation must stop: ErrStopped when a stop string matched in
// choice Output.Index (that choice must end with finish "stop"; the others
// go on), or the error writing to a client that went away (every choice
// must stop). The Backend must then free the request's resources and
// return that error (wrapped), except ErrStopped, which only ends the one
// choice.
type EmitFunc func(Output) error

// Backend generates completions.
type Backend interface {
	// Complete generates req's output, calling emit with each batch of new
	// tokens, and returns the finish reason of each of the N choices
	// ("stop" or "length") once every last token was emitted. Errors: ctx
	// errors when the client went away (or another prompt of the request
	// failed), errors returned by emit, errors wrapping ErrOverloaded,
	// ErrUnavailable or ErrInvalid to choose the HTTP status, and others
	// (500, or an error event once streaming started). The client sees a
	// generic message of the kind, never the error's text, unless the
	// error wraps an *Error (NewError), whose message, code and param it
	// sees as they are. Complete may be called concurrently (the prompts
	// of a batch, other requests).
	Complete(ctx context.Context, req *Request, emit EmitFunc) (finishReasons []string, err error)
}

// A ForwardObserver is a Backend that also hears of each request of a
// model it serves that another region served instead (Regions.Forward:
// this region down, shedding or predicted over the request's TTFT
// budget, or its pools unavailable before the first token). That is
// demand its pools did not serve: the coordinator's planner counts it as
// it counts a request the pools refused, so that a region whose users are
// served elsewhere still looks short. Called once per prompt, after the
// other region's response ended, from the request's goroutine; it must
// not block, nor keep or change req.
type ForwardObserver interface {
	ObserveForwarded(req *Request)
}

// Options configure a Server. Backend and Tokenizer are required.
type Options struct {
	Backend   Backend
	Tokenizer engine.Tokenizer
	// Policy supplies the prompt budgets and the max_tokens cap and default.
	Policy config.Policy
	// Models returns the served models (the first is the default for a
	// request without "model"); nil or empty means none yet.
	Models func() []Model
	// MaxChoices returns the most choices (n) a request may ask: the
	// largest batch of the decode workers (the choices of a request are
	// sequences of one worker's batch), as their heartbeats report it; 0
	// when unknown. nil: only the API's bound (128).
	MaxChoices func() int
	// Ready returns nil when the server may take traffic, else the reason.
	// nil means always ready.
	Ready func() error
	// Metrics receives one observation per request (per prompt of a
	// batched request); nil records nothing.
	Metrics *metrics.Metrics
	// Gatherer is served on /metrics; nil serves prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// TracerProvider, when not nil, traces every completion request: a
	// server span continuing the client's W3C traceparent (its trace
	// context returned in the traceresponse header), a request span per
	// prompt (pkg/tracing), whose context reaches Backend.Complete. nil:
	// no tracing, at no cost.
	TracerProvider trace.TracerProvider
	// Logger gets one line per request (per prompt of a batched request);
	// nil logs nothing.
	Logger *zap.Logger
	// Now is the clock of the budget traces; nil means time.Now. Body
	// deadlines use the wall clock.
	Now func() time.Time
	// Responses keeps the stored responses of the Responses API
	// (pkg/respstore on NATS JetStream); nil: none are kept (a request's
	// store true is answered with store false, previous_response_id with
	// 404).
	Responses ResponseStore
	// Regions forwards a request another region serves within its TTFT
	// budget when this one cannot (package region); nil: no regions.
	Regions Regions
	// Region is this region's name, reported in every request's budget
	// ("region"); "" without regions.
	Region string
	// Tiers chooses the model of a request naming one of Policy.Tiers'
	// aliases; nil: the aliases are not served (a request naming one gets
	// model_not_found).
	Tiers Tiers
	// RetryAfter is sent with 429 and 503; ≤ 0 means 1 s.
	RetryAfter time.Duration
	// MaxBodyBytes bounds a request body; a larger one gets 413. ≤ 0
	// means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxInFlight is the number of completion requests admitted at once,
	// each from before its body is read until its response ends (a
	// batched request holds one per prompt); one more gets 429 with
	// Retry-After at once. With MaxBodyBytes it bounds the memory that
	// request bodies hold. ≤ 0: no limit.
	MaxInFlight int
	// BodyIdleTimeout is the longest a request body may make no progress
	// (no byte read); then the request gets 408 and its connection is
	// closed. It does not apply once the body is read (a response stream
	// may idle). ≤ 0: none.
	BodyIdleTimeout time.Duration
	// BodyTimeout is the longest the whole body of a request may take to
	// arrive, from admission: a body trickled a byte at a time within
	// BodyIdleTimeout still gets 408 then, and gives its admission slot
	// back. ≤ 0: none.
	BodyTimeout time.Duration
	// MaxInFlightBodyBytes is the memory budget of the request bodies
	// being read or held, all requests together: a body takes its
	// Content-Length at admission (or, without one, its buffer as it
	// grows) and gives it back when its response ends. A request that
	// does not fit gets 429 (code "overloaded") with Retry-After, as a
	// full queue. ≤ 0: no budget (MaxInFlight × MaxBodyBytes bounds the
	// bodies).
	MaxInFlightBodyBytes int64
	// WriteTimeout is the longest one write of a response (a stream event
	// or a whole response) may block on a client that does not read;
	// then the request is cancelled, everything it holds on the workers
	// is freed, and pdserve_stream_stalled_cancels_total counts it. ≤ 0:
	// none.
	WriteTimeout time.Duration
	// APIKeys, when not nil, authenticates every request to /v1/ (see
	// "Authentication" in the package doc) and applies its keys' rate
	// limits; the caller reloads it. nil: no authentication.
	APIKeys *apikey.Keys
	// MetricsToken, when not nil, is the bearer token /metrics requires.
	// nil: /metrics is open.
	MetricsToken *apikey.Token
	// ChatTemplate is Jinja source that renders chats in place of the
	// model's template (the tokenizer's tokenizer.chat_template, or its
	// built-in rendering); its tool-call and <think> formats are parsed as
	// for the model's. Compiled by New. Empty: the model's.
	ChatTemplate string
}

// DefaultMaxBodyBytes is the body limit when Options.MaxBodyBytes is not
// set: 16 MiB.
const DefaultMaxBodyBytes = 16 << 20

// MaxSequenceTokens is the most tokens (prompt and output) of one
// sequence, whatever the model: what the workers' RPCs carry (int32). A
// request whose model has no known context length is checked against it.
const MaxSequenceTokens = math.MaxInt32

// UnknownContextMaxTokens is the max_tokens of a request that gives none
// to a model whose context length is unknown (Model.MaxModelLen 0) and
// whose policy sets no default_max_tokens: OpenAI's default on
// /v1/completions, short enough for any worker to take. It is lowered to
// the policy's max_tokens_cap.
const UnknownContextMaxTokens = 16

// Model is one served model, as /v1/models lists it.
type Model struct {
	Name string // the "model" of requests and the "id" in /v1/models
	// MaxModelLen is the longest sequence (prompt + output) in tokens that
	// the model's workers take, reported as "max_model_len"; 0 when
	// unknown (then omitted).
	MaxModelLen int
}

// Server serves the OpenAI-compatible API. Safe for concurrent use.
type Server struct {
	o   Options
	mux *http.ServeMux

	cache *responseCache // nil: the response cache is off

	// tmpl is the model's Jinja chat template, compiled once (nil: none,
	// or it does not compile); tmplBOS the BOS text its renderings lose,
	// "" when the tokenizer does not add BOS.
	tmplOnce sync.Once
	tmpl     *chattmpl.Template
	tmplBOS  string

	// inflight are the Responses API's responses in flight here.
	inflight inflight

	mu       sync.Mutex
	inFlight int // admitted completion requests (prompts), ≤ o.MaxInFlight
	// batchInFlight are those of batch priority, ≤ batchLimit().
	batchInFlight int
	// bodyBytes is what request bodies hold of MaxInFlightBodyBytes.
	bodyBytes int64
}

// New returns a Server. Errors: a missing Backend or Tokenizer, an invalid
// Policy.
func New(o Options) (*Server, error) {
	if o.Backend == nil || o.Tokenizer == nil {
		return nil, errors.New("frontend: Backend and Tokenizer are required")
	}
	if err := o.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	if o.Models == nil {
		o.Models = func() []Model { return nil }
	}
	if o.Ready == nil {
		o.Ready = func() error { return nil }
	}
	if o.Gatherer == nil {
		o.Gatherer = prometheus.DefaultGatherer
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	s := &Server{o: o, mux: http.NewServeMux()}
	if o.ChatTemplate != "" {
		if err := s.compileOverride(); err != nil {
			return nil, err
		}
	}
	var err error
	if s.cache, err = newResponseCache(o); err != nil {
		return nil, err
	}
	s.mux.HandleFunc(RouteCompletions, s.method(http.MethodPost, s.completions))
	s.mux.HandleFunc(RouteChat, s.method(http.MethodPost, s.completions))
	s.mux.HandleFunc(RouteResponses, s.responses)
	s.mux.HandleFunc(RouteResponses+"/", s.responseByID)
	s.mux.HandleFunc(RouteMessages, s.messages)
	s.mux.HandleFunc(RouteModels, s.method(http.MethodGet, s.models))
	s.mux.HandleFunc("/healthz", s.method(http.MethodGet, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	}))
	s.mux.HandleFunc("/readyz", s.method(http.MethodGet, s.readyz))
	var metricsH http.Handler = promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{})
	if o.MetricsToken != nil {
		metricsH = s.metricsAuth(metricsH)
	}
	s.mux.Handle("/metrics", metricsH)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, Message: "no route " + r.URL.Path, Type: "not_found_error"}, 0)
	})
	return s, nil
}

// ServeHTTP implements http.Handler. With APIKeys a request to /v1/ is
// authenticated first, before its method, headers or body are looked at.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.o.APIKeys != nil && authenticates(r.URL.Path) && forwardedOf(r) == nil {
		if r = s.authenticate(w, r); r == nil {
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) method(m string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != m && !(m == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", m)
			writeError(w, &apiError{status: http.StatusMethodNotAllowed, Message: r.Method + " not allowed on " + r.URL.Path + "; use " + m, Type: "invalid_request_error"}, 0)
			return
		}
		h(w, r)
	}
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := s.o.Ready(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready: "+err.Error()+"\n")
		return
	}
	_, _ = io.WriteString(w, "ready\n")
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		MaxModelLen int    `json:"max_model_len,omitempty"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	served := s.o.Models()
	for _, m := range served {
		list.Data = append(list.Data, model{ID: m.Name, Object: "model", OwnedBy: "pdserve", MaxModelLen: m.MaxModelLen})
	}
	// Tier aliases with a model served now, as long as the longest
	// context of those.
	if s.o.Tiers != nil {
		for _, alias := range slices.Sorted(maps.Keys(s.o.Policy.Tiers)) {
			n, ok := 0, false
			for _, m := range served {
				if m.Name == alias {
					ok = false // a served model's name is not an alias
					break
				}
				if slices.Contains(s.o.Policy.Tiers[alias].Models, m.Name) {
					n, ok = max(n, m.MaxModelLen), true
				}
			}
			if ok {
				list.Data = append(list.Data, model{ID: alias, Object: "model", OwnedBy: "pdserve-tier", MaxModelLen: n})
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// admit takes k in-flight slots, all or none, or returns the 429 of why not;
// batch slots only within batchLimit, so that under load batch requests
// are refused first and interactive ones last.
func (s *Server) admit(k int, batch bool) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.o.MaxInFlight > 0 && s.inFlight+k > s.o.MaxInFlight {
		return s.queueFull()
	}
	if batch && s.o.MaxInFlight > 0 && s.batchInFlight+k > s.batchLimit() {
		return s.batchFull()
	}
	s.inFlight += k
	if batch {
		s.batchInFlight += k
	}
	return nil
}

// release gives back k slots taken by admit.
func (s *Server) release(k int, batch bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight -= k
	if batch {
		s.batchInFlight -= k
	}
}

// takeBody takes n bytes of the body budget, all or none, and reports
// whether it did; always without a budget.
func (s *Server) takeBody(n int64) bool {
	if s.o.MaxInFlightBodyBytes <= 0 || n <= 0 {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > s.o.MaxInFlightBodyBytes-s.bodyBytes {
		return false
	}
	s.bodyBytes += n
	return true
}

// giveBody gives back n bytes taken by takeBody.
func (s *Server) giveBody(n int64) {
	if s.o.MaxInFlightBodyBytes <= 0 || n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bodyBytes -= n
}

// bodyBudgetFull is the 429 of a body that does not fit the budget.
func (s *Server) bodyBudgetFull() *apiError {
	return overloaded("request bodies in flight hold the %d bytes of the server's budget; retry later", s.o.MaxInFlightBodyBytes)
}

// queueFull is the 429 of a full server.
func (s *Server) queueFull() *apiError {
	return overloaded("%d requests in flight, the queue limit; retry later", s.o.MaxInFlight)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	chat := r.URL.Path == RouteChat
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	s.serve(w, r, chat, prefix+newID(), nil)
}

// bodyTransform turns the body of another API (the Responses API) into
// a chat completions body, or refuses it. cl is the request's client.
type bodyTransform func(data []byte, cl client) ([]byte, *apiError)

// serve runs a completion request of id: admission, rate limits, the
// body (transformed by transform, when not nil, into a chat body), the
// prompt's checks and the call.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, chat bool, id string, transform bodyTransform) {
	// A chatTap sees the call (its prompt's tokens, its stop strings).
	obs, _ := w.(interface{ observe(*call) })
	arrival := s.o.Now()
	tr := &budget.Trace{RequestID: id, Arrival: arrival}
	w.Header().Set("X-Request-Id", id)
	if s.o.TracerProvider != nil {
		ctx, span := tracing.StartHTTP(s.o.TracerProvider, r, r.URL.Path, arrival)
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		defer func() { tracing.EndHTTP(span, sw.status) }()
		w, r = sw, r.WithContext(ctx)
		if v := tracing.TraceResponse(span); v != "" { // sampled
			w.Header().Set("traceresponse", v)
			tr.TraceID = span.SpanContext().TraceID().String()
		}
	}
	cl := client{key: keyOf(r), fwd: forwardedOf(r), retry: retryOf(r)}
	if cl.key == nil && cl.fwd == nil {
		cl.raw = apiKey(r)
	}
	if s.o.Region != "" {
		tr.Region.Name = s.o.Region
		if cl.fwd != nil {
			tr.Region.Origin, tr.Region.RTT = cl.fwd.Origin, cl.fwd.RTT
		}
	}
	if cl.fwd == nil {
		// A forwarded request's network term is the region's RTT: its
		// connection is the origin coordinator's, not the client's.
		tr.ClientRTT, _ = clientRTT(r.Context())
	}
	refuse := func(aerr *apiError) {
		// A peer's refusal used none of the tokens the origin charged.
		cl.fwd.used(0)
		tr.Status = aerr.traceStatus()
		extra := cl.fields()
		if aerr.Code != nil && *aerr.Code == "rate_limit_exceeded" {
			extra = append(extra, zap.String("api_key_sha256", cl.key.Prefix))
		}
		s.finish(tr, aerr, extra...)
		if aerr.status != statusClientClosed {
			writeError(w, aerr, s.o.RetryAfter)
		}
	}

	if aerr := checkContentType(r); aerr != nil {
		refuse(aerr)
		return
	}
	// A key's requests a minute, before admission: a key over its limit
	// takes no slot.
	if cl.key != nil {
		q := cl.key.TakeRequest(arrival)
		rateLimitHeaders(w.Header(), q)
		if !q.OK() {
			w.Header().Set("Connection", "close") // the body stays unread
			refuse(rateLimited(cl.key, q))
			return
		}
	}
	route := RouteCompletions
	if chat {
		route = RouteChat
	}
	obj, aerr := s.objective(r, cl, route)
	if aerr != nil {
		w.Header().Set("Connection", "close") // the body stays unread
		refuse(aerr)
		return
	}
	tr.Objective = obj
	batch := obj.Priority == config.PriorityBatch
	// Admission comes before the body is read: a full server holds no
	// more bodies than MaxInFlight.
	if aerr := s.admit(1, batch); aerr != nil {
		w.Header().Set("Connection", "close") // the body stays unread
		refuse(aerr)
		return
	}
	held := 1
	defer func() { s.release(held, batch) }()
	// The body's bytes, from now until the response ends.
	var bodyHeld int64
	defer func() { s.giveBody(bodyHeld) }()
	if n := min(r.ContentLength, s.o.MaxBodyBytes); n > 0 {
		if !s.takeBody(n) {
			w.Header().Set("Connection", "close") // the body stays unread
			refuse(s.bodyBudgetFull())
			return
		}
		bodyHeld = n
	}
	if s.o.WriteTimeout > 0 {
		tw := &timedWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: s.o.WriteTimeout}
		defer func() {
			_ = tw.rc.SetWriteDeadline(time.Time{}) // the connection may serve another request
			if tw.stalled {
				s.o.Metrics.StreamStalled()
				s.o.Logger.Warn("client stopped reading: request cancelled", zap.String("request_id", id),
					zap.Duration("write_timeout", s.o.WriteTimeout), zap.String("remote_addr", r.RemoteAddr))
			}
		}()
		w = tw
	}

	data, aerr := s.readBody(w, r, &bodyHeld)
	if aerr != nil {
		refuse(aerr)
		return
	}
	if transform != nil {
		if data, aerr = transform(data, cl); aerr != nil {
			refuse(aerr)
			return
		}
	}
	// A request a client sent here may be served in another region: its
	// body is kept until that is decided.
	var raw []byte
	if s.o.Regions != nil && transform == nil && cl.fwd == nil {
		raw = data
	}
	pl, aerr := s.prepare(data, chat, cl, tr)
	data = nil // the prompts are parsed; let a large body go
	if aerr != nil {
		if raw != nil && aerr.Code != nil && (*aerr.Code == "no_workers" || *aerr.Code == "model_not_found") {
			// Nothing serves it here: another region may. Its tokens
			// cannot be counted here before it runs (no tokenizer of
			// its model, maybe): it reserves the one token every
			// request uses, and is settled to what it used there, into
			// debt if need be (the rule of every path: package apikey).
			f := Forwardable{Route: r.URL.Path, Model: tr.Model, PromptTokens: tr.PromptTokens}
			reserved := 0
			if cl.key != nil {
				q := cl.key.TakeTokens(s.o.Now(), 1)
				rateLimitHeaders(w.Header(), q)
				if !q.OK() {
					refuse(rateLimited(cl.key, q))
					return
				}
				reserved = 1
				f.Settle = func(used int) {
					cl.key.SettleTokens(s.o.Now(), reserved, used)
					reserved = 0
				}
			}
			if s.forward(w, r, raw, cl, tr, f, nil) {
				return
			}
			if reserved > 0 {
				cl.key.SettleTokens(s.o.Now(), reserved, 0) // served nowhere
			}
		}
		refuse(aerr)
		return
	}
	if extra := len(pl.reqs) - 1; extra > 0 {
		if aerr := s.admit(extra, batch); aerr != nil {
			refuse(aerr)
			return
		}
		held += extra
	}
	// A key's tokens a minute, last: what the request may use at most,
	// the part it did not use given back when it ends (call.run, before
	// the end of the response).
	if cl.key != nil {
		asked := pl.tokens()
		q := cl.key.TakeTokens(s.o.Now(), asked)
		rateLimitHeaders(w.Header(), q)
		if !q.OK() {
			refuse(rateLimited(cl.key, q))
			return
		}
		pl.tokensTaken = asked // given back in part by call.run
	}
	if raw != nil {
		model := pl.model
		if tr.Objective.Tier != "" {
			model = tr.Objective.Tier
		}
		f := Forwardable{Route: r.URL.Path, Model: model, Served: pl.model, PromptTokens: tr.PromptTokens}
		if pl.tokensTaken > 0 {
			// Charged here once, for what the request may use at most:
			// the peer's usage settles it, before the end of its
			// response reaches the client. Without one (a response cut
			// midway) the whole charge stands.
			f.Settle = func(used int) {
				cl.key.SettleTokens(s.o.Now(), pl.tokensTaken, used)
				pl.tokensTaken = 0
			}
		}
		if s.forward(w, r, raw, cl, tr, f, pl.reqs) {
			return
		}
	}
	c := newCall(s, pl, id, arrival.Unix(), w)
	if raw != nil {
		// Served here unless it fails before any output as unavailable:
		// then another region, by availability (Served ""). The key is
		// charged what it used there instead of what it used here.
		f := Forwardable{Route: r.URL.Path, Model: pl.model, PromptTokens: tr.PromptTokens}
		if tr.Objective.Tier != "" {
			f.Model = tr.Objective.Tier
		}
		c.elsewhere = func() bool {
			if cl.key != nil {
				here := pl.used() // what stands charged: call.run settled to it
				f.Settle = func(used int) { cl.key.SettleTokens(s.o.Now(), here, used) }
			}
			return s.forward(w, r, raw, cl, tr, f, pl.reqs)
		}
	}
	if obs != nil {
		obs.observe(c)
	}
	c.run(r.Context(), w)
}

// forward asks Regions to serve the request in another region, and
// reports whether one did (its answer written to w); the request's log
// line and metrics then record it as forwarded, with the region.
// reqs are the request's prompts as prepared here (nil when none could
// be: no model of it served here), which the Backend, a ForwardObserver,
// hears of once another region served them.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, raw []byte, cl client, tr *budget.Trace, f Forwardable, reqs []*Request) bool {
	f.Key, _ = cl.keyName()
	if cl.key == nil {
		f.Key = ""
	}
	f.Tenant = cl.tenant()
	f.Objective, f.Arrival, f.ClientRTT = tr.Objective, tr.Arrival, tr.ClientRTT
	fw := s.o.Regions.Forward(w, r, raw, f)
	if fw.Region == "" {
		return false
	}
	tr.Status = budget.StatusForwarded
	tr.Region = budget.Region{Name: fw.Region, Origin: s.o.Region, RTT: fw.RTT}
	if fo, ok := s.o.Backend.(ForwardObserver); ok {
		for _, req := range reqs {
			fo.ObserveForwarded(req)
		}
	}
	fields := append(cl.fields(), zap.Int("http_status", fw.Status))
	if fw.Err != nil {
		fields = append(fields, zap.NamedError("cause", fw.Err))
	}
	s.finish(tr, nil, fields...)
	return true
}

// checkContentType accepts application/json, with any parameters, and a
// request without Content-Type (read as JSON); anything else, such as the
// form type of curl -d, gets 415.
func checkContentType(r *http.Request) *apiError {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	if mt, _, err := mime.ParseMediaType(ct); (err == nil || errors.Is(err, mime.ErrInvalidMediaParameter)) && mt == "application/json" {
		return nil
	}
	return &apiError{status: http.StatusUnsupportedMediaType, Message: "Content-Type must be application/json",
		Type: "invalid_request_error", Code: ptr("unsupported_media_type")}
}

// readBody reads the request body, at most MaxBodyBytes (413 beyond),
// each read within BodyIdleTimeout and the whole within BodyTimeout (408
// otherwise); a client that went away mid-body is a cancellation. *held
// is what the body holds of the body budget (its Content-Length, taken
// at admission); a body without one takes its buffer as it grows, and
// gets 429 when that does not fit. The buffer grows with the bytes
// received, so a slow client holds memory for what it sent.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, held *int64) ([]byte, *apiError) {
	limit := s.o.MaxBodyBytes
	tooLarge := func() *apiError {
		w.Header().Set("Connection", "close")
		return &apiError{status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("The request body is over the limit of %d bytes.", limit),
			Type: "invalid_request_error", Code: ptr("request_too_large")}
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	var body io.Reader = http.MaxBytesReader(w, r.Body, limit)
	var deadline time.Time
	if s.o.BodyTimeout > 0 {
		deadline = time.Now().Add(s.o.BodyTimeout)
	}
	if s.o.BodyIdleTimeout > 0 || s.o.BodyTimeout > 0 {
		rc := http.NewResponseController(w)
		body = &idleReader{r: body, rc: rc, idle: s.o.BodyIdleTimeout, deadline: deadline}
		// Clear the deadline at once: the connection's background read
		// (which notices a client going away) and a response stream must
		// not be cut by it.
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	size := int64(512)
	if r.ContentLength > 0 {
		size = r.ContentLength + 1 // the read that sees EOF needs a byte of room
	}
	grow := func(n int64) bool {
		if r.ContentLength > 0 {
			return true // taken at admission
		}
		if !s.takeBody(n) {
			return false
		}
		*held += n
		return true
	}
	data, err := readAll(body, size, limit, grow)
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case err == nil:
		return data, nil
	case errors.Is(err, errBodyBudget):
		w.Header().Set("Connection", "close")
		return nil, s.bodyBudgetFull()
	case errors.As(err, &mbe):
		return nil, tooLarge()
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		w.Header().Set("Connection", "close")
		msg := fmt.Sprintf("The request body made no progress for %v.", s.o.BodyIdleTimeout)
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			msg = fmt.Sprintf("The request body did not arrive within %v.", s.o.BodyTimeout)
		}
		e := &apiError{status: http.StatusRequestTimeout, Message: msg, Type: "invalid_request_error", Code: ptr("timeout")}
		e.cause = err
		return nil, e
	default:
		return nil, cancelled(err) // the client went away mid-body
	}
}

// idleReader sets a read deadline before each Read: idle from now (none
// when idle is 0), and no later than deadline (when not zero).
type idleReader struct {
	r        io.Reader
	rc       *http.ResponseController
	idle     time.Duration
	deadline time.Time
}

func (b *idleReader) Read(p []byte) (int, error) {
	d := b.deadline
	if b.idle > 0 {
		if t := time.Now().Add(b.idle); d.IsZero() || t.Before(d) {
			d = t
		}
	}
	_ = b.rc.SetReadDeadline(d) // unsupported: no deadline
	return b.r.Read(p)
}

// timedWriter arms a write deadline timeout from now before each Write
// of the response, and records whether one expired (the client stopped
// reading). http.ResponseController reaches the writer it wraps.
// statusWriter records the status code of a traced response.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type timedWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController // of the wrapped writer
	timeout time.Duration
	stalled bool
}

func (t *timedWriter) Write(p []byte) (int, error) {
	_ = t.rc.SetWriteDeadline(time.Now().Add(t.timeout)) // unsupported: none
	n, err := t.ResponseWriter.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.stalled = true
	}
	return n, err
}

// FlushError flushes within the deadline of the last Write.
func (t *timedWriter) FlushError() error {
	err := t.rc.Flush()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.stalled = true
	}
	return err
}

func (t *timedWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// errBodyBudget: a body without Content-Length outgrew the body budget.
var errBodyBudget = errors.New("frontend: body budget exhausted")

// readAll reads r to its end into a buffer of size bytes first, growing
// it by doubling up to just over limit (r is expected to stop there).
// grow is asked for the bytes of each growth; errBodyBudget when it
// refuses.
func readAll(r io.Reader, size, limit int64, grow func(int64) bool) ([]byte, error) {
	size = min(size, limit+1)
	if !grow(size) {
		return nil, errBodyBudget
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			n := min(2*int64(cap(buf)), limit+1)
			if n <= int64(len(buf)) {
				n = int64(len(buf)) + 512
			}
			if !grow(n - int64(cap(buf))) {
				return nil, errBodyBudget
			}
			nb := make([]byte, len(buf), n)
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// plan is a validated request ready to run: one Request per prompt.
type plan struct {
	p      *params
	model  string
	reqs   []*Request
	echo   []string // per prompt: the text echoed before each choice, or ""
	client client
	// tokensTaken is what was taken from the key's tokens-a-minute
	// bucket (tokens()), 0 when nothing was.
	tokensTaken int
	// format is chat's tool-call format; inThink: the prompt opened
	// <think>.
	format  chattmpl.Format
	inThink bool
}

// tokens returns the most tokens the request may use: every prompt's
// tokens and n × max_tokens each, and its grammar's cost (grammarTokens).
//
// It cannot overflow: prepare bounds each prompt and its max_tokens to
// MaxSequenceTokens, N to maxN and the prompts to the batch limit; it
// saturates all the same.
func (pl *plan) tokens() int {
	n := pl.grammarTokens()
	for _, r := range pl.reqs {
		n = satAdd(n, satAdd(len(r.Prompt), satMul(r.N, r.MaxTokens)))
	}
	return n
}

// grammarTokens is what the request's grammar costs against the key's
// tokens a minute: grammar.CostTokens for each choice of each prompt
// decoded under it. It is charged whatever the output: tokens and used
// both count it, so it is never given back.
func (pl *plan) grammarTokens() int {
	n := 0
	for _, r := range pl.reqs {
		n = satAdd(n, satMul(r.N, grammar.CostTokens(r.Sampling.Grammar)))
	}
	return n
}

// satAdd and satMul return a+b and a×b for a, b ≥ 0, math.MaxInt when
// that overflows.
func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

func satMul(a, b int) int {
	if a != 0 && b > math.MaxInt/a {
		return math.MaxInt
	}
	return a * b
}

// used returns the tokens the request used: every prompt's tokens, the
// output tokens delivered, and its grammar's cost. Call it once the request ended.
func (pl *plan) used() int {
	n := pl.grammarTokens()
	for _, r := range pl.reqs {
		n += len(r.Prompt) + r.Trace.OutputTokens
	}
	return n
}

// prepare validates a request body of the chat or completions route,
// tokenizes its prompts, checks them against their surface's budget and
// the model's context, and builds one Request per prompt. It sets tr's
// Model and PromptTokens (all prompts together) as soon as they are
// known; a batched request's prompts get traces of their own.
func (s *Server) prepare(data []byte, chat bool, cl client, tr *budget.Trace) (*plan, *apiError) {
	models := s.o.Models()
	p, aerr := parseBody(data, chat, s.bodyLimits(models))
	if aerr != nil {
		return nil, aerr
	}
	tr.Model = p.model // as named, until resolved
	if len(models) == 0 {
		return nil, &apiError{status: http.StatusServiceUnavailable, Message: "No model is served yet: no workers have joined.", Type: "service_unavailable", Code: ptr("no_workers")}
	}
	model := p.model
	if model == "" {
		model = models[0].Name
	}
	i := slices.IndexFunc(models, func(m Model) bool { return m.Name == model })
	maxLen := 0 // 0 when unknown
	// A tier alias (not a served model's name) is resolved to one of its
	// models once the prompt's tokens are known.
	var tierModels []string
	if i >= 0 {
		maxLen = models[i].MaxModelLen
	} else if t, ok := s.o.Policy.Tiers[model]; ok && s.o.Tiers != nil {
		tierModels = t.Models
	} else {
		return nil, &apiError{status: http.StatusNotFound, Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model),
			Type: "invalid_request_error", Param: ptr("model"), Code: ptr("model_not_found")}
	}
	tr.Model = model
	if s.o.MaxChoices != nil {
		if mc := s.o.MaxChoices(); mc > 0 && p.n > mc {
			return nil, badRequest("n", "invalid_value", "n must be in 1..%d, the most sequences a worker batches, got %d", mc, p.n)
		}
	}

	route, promptParam := RouteCompletions, "prompt"
	if chat {
		route, promptParam = RouteChat, "messages"
	}
	type tokenized struct {
		ids  []int32
		echo string
	}
	var prompts []tokenized
	pl := &plan{p: p, model: model, client: cl}
	if chat {
		r, aerr := s.renderChat(p)
		if aerr != nil {
			return nil, aerr
		}
		pl.format, pl.inThink = r.format, r.inThink
		if p.sampling.Grammar == "" {
			if p.sampling.Grammar, aerr = toolGrammar(p, r.format); aerr != nil {
				return nil, aerr
			}
		}
		ids, aerr := nonEmpty(s.o.Tokenizer.Encode(r.text), "messages")
		if aerr != nil {
			return nil, aerr
		}
		prompts = append(prompts, tokenized{ids: ids})
	} else {
		if s.o.MaxInFlight > 0 && len(p.prompts) > s.o.MaxInFlight {
			return nil, badRequest("prompt", "invalid_value", "%d prompts are more than the %d requests the server admits at once", len(p.prompts), s.o.MaxInFlight)
		}
		for _, in := range p.prompts {
			var t tokenized
			if in.isIDs {
				if t.ids, aerr = checkIDs(in.ids, s.o.Tokenizer.Vocab()); aerr != nil {
					return nil, aerr
				}
				if p.echo {
					t.echo = s.o.Tokenizer.Decode(in.ids)
				}
			} else if t.ids, aerr = nonEmpty(s.o.Tokenizer.Encode(in.text), "prompt"); aerr != nil {
				return nil, aerr
			} else if p.echo {
				t.echo = in.text
			}
			prompts = append(prompts, t)
		}
	}
	for _, t := range prompts {
		tr.PromptTokens += len(t.ids)
	}
	if tierModels != nil {
		if model, aerr = s.chooseTier(model, tierModels, tr); aerr != nil {
			return nil, aerr
		}
		tr.Model, pl.model = model, model
		if j := slices.IndexFunc(models, func(m Model) bool { return m.Name == model }); j >= 0 {
			maxLen = models[j].MaxModelLen
		}
	}

	limit, surface := cl.budget(s.o.Policy.Budgets, route)
	for i, t := range prompts {
		which := promptParam
		if len(prompts) > 1 {
			which = fmt.Sprintf("prompt %d", i)
		}
		if limit > 0 && len(t.ids) > limit {
			return nil, badRequest(promptParam, "prompt_too_long", "%s has %d tokens, over the budget of %d tokens for %s", which, len(t.ids), limit, surface)
		}
		maxTokens, aerr := s.maxTokens(p, len(t.ids), maxLen, promptParam)
		if aerr != nil {
			return nil, aerr
		}
		req := &Request{
			ID: tr.RequestID, Route: route, Model: model, Prompt: t.ids, MaxTokens: maxTokens, N: p.n,
			Sampling: p.sampling, IgnoreEOS: p.ignoreEOS, Logprobs: p.logprobs, PromptLogprobs: -1, Trace: tr,
			Tenant: cl.tenant(), Retry: cl.retry,
		}
		if !p.seeded {
			req.Sampling.Seed = newSeed()
		}
		if pen := p.sampling.Penalties; pen != nil {
			req.Sampling.Penalties = &sampling.Penalties{Presence: pen.Presence, Frequency: pen.Frequency}
		}
		if p.echo && p.logprobs >= 0 {
			req.PromptLogprobs = p.logprobs
		}
		if len(prompts) > 1 {
			req.ID = fmt.Sprintf("%s-%d", tr.RequestID, i)
			req.Trace = &budget.Trace{RequestID: req.ID, Arrival: tr.Arrival, TraceID: tr.TraceID, Model: model, PromptTokens: len(t.ids), Objective: tr.Objective}
		}
		pl.reqs = append(pl.reqs, req)
		pl.echo = append(pl.echo, t.echo)
	}
	return pl, nil
}

// maxTokens returns the max_tokens of a prompt of promptLen tokens for a
// model of maxLen tokens (0: unknown): the one asked, checked against the
// cap and the context, else the rest of the context, lowered to the
// policy's default and cap (see config.Limits).
func (s *Server) maxTokens(p *params, promptLen, maxLen int, promptParam string) (int, *apiError) {
	lim := s.o.Policy.Limits
	if p.maxTokens > 0 {
		// Every comparison is written so that no sum can overflow:
		// max_tokens is any positive int64 a client sends.
		if lim.MaxTokensCap > 0 && p.maxTokens > lim.MaxTokensCap {
			return 0, badRequest(p.maxParam, "max_tokens_over_cap", "%s %d is over the cap of %d", p.maxParam, p.maxTokens, lim.MaxTokensCap)
		}
		if maxLen > 0 && p.maxTokens >= maxLen {
			// Alone over the context: whatever the prompt, max_tokens is
			// at fault.
			return 0, badRequest(p.maxParam, "context_length_exceeded",
				"This model's maximum context length is %d tokens. However, you requested %d tokens in the completion (%s), which leaves no room for the %s. Please reduce %s.",
				maxLen, p.maxTokens, p.maxParam, promptParam, p.maxParam)
		}
		if maxLen <= 0 && p.maxTokens > MaxSequenceTokens-promptLen {
			return 0, badRequest(p.maxParam, "invalid_value", "%s %d and the prompt's %d tokens are over the %d tokens a sequence may have", p.maxParam, p.maxTokens, promptLen, MaxSequenceTokens)
		}
		if maxLen > 0 && p.maxTokens > maxLen-promptLen {
			// vLLM's and OpenAI's wording, checked before any worker is asked.
			return 0, badRequest(promptParam, "context_length_exceeded",
				"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
				maxLen, promptLen+p.maxTokens, promptLen, promptParam, p.maxTokens, promptParam)
		}
		return p.maxTokens, nil
	}
	n := UnknownContextMaxTokens
	if maxLen > 0 {
		n = maxLen - promptLen
		if n < 1 {
			return 0, badRequest(promptParam, "context_length_exceeded",
				"This model's maximum context length is %d tokens. However, your %s has %d tokens, which leaves no room for the completion. Please reduce the length of the %s.",
				maxLen, promptParam, promptLen, promptParam)
		}
	}
	if lim.DefaultMaxTokens > 0 {
		n = min(n, lim.DefaultMaxTokens)
		if maxLen == 0 {
			n = lim.DefaultMaxTokens
		}
	}
	if lim.MaxTokensCap > 0 {
		n = min(n, lim.MaxTokensCap)
	}
	return n, nil
}

// finish logs the request line and observes its metrics.
func (s *Server) finish(tr *budget.Trace, aerr *apiError, extra ...zap.Field) {
	fields := tr.Fields()
	if aerr != nil {
		fields = append(fields, zap.Int("http_status", aerr.status), zap.String("error", aerr.Message))
		if aerr.cause != nil {
			fields = append(fields, zap.NamedError("cause", aerr.cause))
		}
	}
	fields = append(fields, extra...)
	s.o.Logger.Info("request", fields...)
	// The tiers learn first: once a request is counted in the metrics,
	// its TTFT is in the tier's predictions too.
	if s.o.Tiers != nil {
		s.o.Tiers.Observe(tr)
	}
	s.o.Metrics.ObserveRequest(tr)
}

// apiKey returns the key of an Authorization: Bearer or x-api-key
// header, "" when none.
func apiKey(r *http.Request) string {
	k, _ := credentials(r)
	return k
}

// newID returns 24 random hex characters.
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// newSeed returns a random sampling seed, for a request without "seed".
func newSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}
