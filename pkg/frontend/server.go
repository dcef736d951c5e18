package frontend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/engine"
	"github.com/pdserve/pdserve/pkg/metrics"
)

// Routes served by the frontend.
const (
	RouteCompletions = "/v1/completions"
	RouteChat        = "/v1/chat/completions"
	RouteModels      = "/v1/models"
)

// Request is a validated completion request handed to a Backend.
type Request struct {
	ID        string // unique, e.g. "cmpl-…"; also the id on the workers
	Route     string // RouteCompletions or RouteChat
	Model     string
	Prompt    []int32 // non-empty, ids within the vocabulary; read only
	MaxTokens int     // 1..cap
	Sampling  engine.Sampling
	IgnoreEOS bool
	// Trace is the request's budget, with Arrival, RequestID, Model and
	// PromptTokens set. The Backend fills worker boundaries and facts; the
	// frontend records tokens, the status and the finish. Owned by the
	// goroutine running Complete until it returns.
	Trace *budget.Trace
}

// EmitFunc hands output tokens to the client, in order. It must not be
// called concurrently nor after Complete returned. It returns an error
// when generation must stop: ErrStopped when a stop string matched, or the
// error writing to a client that went away. The Backend must then stop,
// free the request's resources and return that error (wrapped).
type EmitFunc func(tokens []int32) error

// Backend generates completions.
type Backend interface {
	// Complete generates req's output, calling emit with each batch of new
	// tokens, and returns the finish reason ("stop" or "length") once the
	// last token was emitted. Errors: ctx errors when the client went away,
	// errors returned by emit, errors wrapping ErrOverloaded,
	// ErrUnavailable or ErrInvalid to choose the HTTP status, and others
	// (500, or an error event once streaming started).
	Complete(ctx context.Context, req *Request, emit EmitFunc) (finishReason string, err error)
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
	// Ready returns nil when the server may take traffic, else the reason.
	// nil means always ready.
	Ready func() error
	// Metrics receives one observation per request; nil records nothing.
	Metrics *metrics.Metrics
	// Gatherer is served on /metrics; nil serves prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// Logger gets one line per request; nil logs nothing.
	Logger *zap.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// RetryAfter is sent with 429 and 503; ≤ 0 means 1 s.
	RetryAfter time.Duration
	// MaxBodyBytes bounds a request body; ≤ 0 means 16 MiB.
	MaxBodyBytes int64
}

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
		o.MaxBodyBytes = 16 << 20
	}
	s := &Server{o: o, mux: http.NewServeMux()}
	s.mux.HandleFunc(RouteCompletions, s.method(http.MethodPost, s.completions))
	s.mux.HandleFunc(RouteChat, s.method(http.MethodPost, s.completions))
	s.mux.HandleFunc(RouteModels, s.method(http.MethodGet, s.models))
	s.mux.HandleFunc("/healthz", s.method(http.MethodGet, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	}))
	s.mux.HandleFunc("/readyz", s.method(http.MethodGet, s.readyz))
	s.mux.Handle("/metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, Message: "no route " + r.URL.Path, Type: "not_found_error"}, 0)
	})
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

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
	for _, m := range s.o.Models() {
		list.Data = append(list.Data, model{ID: m.Name, Object: "model", OwnedBy: "pdserve", MaxModelLen: m.MaxModelLen})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// call is one completion request in flight.
type call struct {
	s       *Server
	req     *Request
	chat    bool
	stream  bool
	usage   bool // stream_options.include_usage
	created int64
	text    *textStream
	// returnIDs: return_token_ids; pendingIDs are the ids not yet sent.
	returnIDs  bool
	pendingIDs []int32
	out        strings.Builder // non-streaming text
	sse        *sseWriter
	// writeErr is set when writing to the client failed: it went away.
	writeErr error
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	arrival := s.o.Now()
	chat := r.URL.Path == RouteChat
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	tr := &budget.Trace{RequestID: prefix + newID(), Arrival: arrival}
	w.Header().Set("X-Request-Id", tr.RequestID)

	c, aerr := s.parse(r, chat, tr)
	if aerr != nil {
		tr.Status = budget.StatusInvalid
		if aerr.status == http.StatusServiceUnavailable {
			tr.Status = budget.StatusUnavailable
		}
		s.finish(tr, aerr)
		writeError(w, aerr, s.o.RetryAfter)
		return
	}
	c.sse = &sseWriter{w: w, rc: http.NewResponseController(w)}

	finish, err := s.o.Backend.Complete(r.Context(), c.req, c.emit)
	if errors.Is(err, ErrStopped) {
		finish, err = "stop", nil
	}
	if err != nil {
		c.fail(w, r.Context(), err)
		return
	}
	tr.FinishReason, tr.Status = finish, budget.StatusOK
	if werr := c.complete(w, finish); werr != nil {
		tr.Status = budget.StatusCancelled
	}
	s.finish(tr, nil)
}

// parse validates the request and builds the call. It sets the trace's
// model and prompt tokens as soon as they are known.
func (s *Server) parse(r *http.Request, chat bool, tr *budget.Trace) (*call, *apiError) {
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, s.o.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("request body over %d bytes", mbe.Limit), Type: "invalid_request_error"}
		}
		return nil, badRequest("", "invalid_body", "reading request body: %v", err)
	}
	b, aerr := parseBody(data)
	if aerr != nil {
		return nil, aerr
	}
	if aerr := b.checkOptions(); aerr != nil {
		return nil, aerr
	}
	models := s.o.Models()
	if len(models) == 0 {
		return nil, &apiError{status: http.StatusServiceUnavailable, Message: "no model is served yet: no workers have joined", Type: "service_unavailable", Code: ptr("no_workers")}
	}
	names := make([]string, len(models))
	for i, m := range models {
		names[i] = m.Name
	}
	model := b.Model
	if model == "" {
		model = names[0]
	}
	maxLen := 0 // the model's context length, 0 when unknown
	if i := slices.Index(names, model); i >= 0 {
		maxLen = models[i].MaxModelLen
	} else {
		return nil, &apiError{status: http.StatusBadRequest, Message: fmt.Sprintf("model %q is not served here (served: %s)", model, strings.Join(names, ", ")),
			Type: "invalid_request_error", Param: ptr("model"), Code: ptr("model_not_found")}
	}
	tr.Model = model

	var prompt []int32
	promptParam := "prompt"
	if chat {
		promptParam = "messages"
		msgs, aerr := b.chatMessages()
		if aerr != nil {
			return nil, aerr
		}
		text, aerr := renderChat(s.o.Tokenizer, msgs)
		if aerr != nil {
			return nil, aerr
		}
		if prompt, aerr = nonEmpty(s.o.Tokenizer.Encode(text)); aerr != nil {
			aerr.Param = ptr("messages")
			return nil, aerr
		}
	} else if prompt, aerr = b.promptTokens(s.o.Tokenizer.Encode, s.o.Tokenizer.Vocab()); aerr != nil {
		return nil, aerr
	}
	tr.PromptTokens = len(prompt)

	route := RouteCompletions
	if chat {
		route = RouteChat
	}
	limit, surface := s.o.Policy.Budgets.Budget(route, apiKey(r))
	if limit > 0 && len(prompt) > limit {
		return nil, badRequest(promptParam, "prompt_too_long", "prompt has %d tokens, over the budget of %d tokens for %s", len(prompt), limit, surface)
	}

	maxTokens := s.o.Policy.Limits.DefaultMaxTokens
	param := "max_tokens"
	switch {
	case b.MaxTokens != nil:
		maxTokens = *b.MaxTokens
	case chat && b.MaxCompletionTokens != nil:
		maxTokens, param = *b.MaxCompletionTokens, "max_completion_tokens"
	}
	if maxTokens < 1 {
		return nil, badRequest(param, "invalid_value", "%s must be at least 1, got %d", param, maxTokens)
	}
	if limit := s.o.Policy.Limits.MaxTokensCap; maxTokens > limit {
		return nil, badRequest(param, "max_tokens_over_cap", "%s %d is over the cap of %d", param, maxTokens, limit)
	}
	if maxLen > 0 && len(prompt)+maxTokens > maxLen {
		// vLLM's and OpenAI's wording, checked before any worker is asked.
		return nil, badRequest(promptParam, "context_length_exceeded",
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
			maxLen, len(prompt)+maxTokens, len(prompt), promptParam, maxTokens, promptParam)
	}
	stops, aerr := b.stops()
	if aerr != nil {
		return nil, aerr
	}

	var sampling engine.Sampling
	if b.Temperature != nil {
		sampling.Temperature = float32(*b.Temperature)
	}
	if b.TopP != nil {
		sampling.TopP = float32(*b.TopP)
	}
	if b.Seed != nil {
		sampling.Seed = uint64(*b.Seed)
	}
	return &call{
		s:    s,
		chat: chat, stream: b.Stream, usage: b.Stream && b.StreamOptions != nil && b.StreamOptions.IncludeUsage,
		created:   tr.Arrival.Unix(),
		text:      &textStream{decode: s.o.Tokenizer.DecodeToken, stops: stops},
		returnIDs: b.ReturnTokenIDs,
		req: &Request{
			ID: tr.RequestID, Route: route, Model: model, Prompt: prompt, MaxTokens: maxTokens,
			Sampling: sampling, IgnoreEOS: b.IgnoreEOS, Trace: tr,
		},
	}, nil
}

// emit is the call's EmitFunc.
func (c *call) emit(tokens []int32) error {
	if len(tokens) == 0 {
		return nil
	}
	text, stopped := c.text.push(tokens)
	if c.returnIDs {
		c.pendingIDs = append(c.pendingIDs, tokens...)
	}
	var err error
	if c.stream {
		if text != "" || !c.sse.started {
			err = c.sse.event(c.chunk(text, nil))
		}
	} else {
		c.out.WriteString(text)
	}
	if err == nil {
		// Record the delivery once the client has it (or, for a
		// non-streaming response, once it is final).
		c.req.Trace.Tokens(c.s.o.Now(), len(tokens))
	}
	switch {
	case err != nil:
		c.writeErr = err
		return err
	case stopped:
		return ErrStopped
	}
	return nil
}

// complete writes the end of a successful response.
func (c *call) complete(w http.ResponseWriter, finish string) error {
	tr := c.req.Trace
	rest := c.text.flush()
	if !c.stream {
		c.out.WriteString(rest)
		s := tr.Summary()
		w.Header().Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(c.response(c.out.String(), finish, &s))
	}
	if rest != "" {
		if err := c.sse.event(c.chunk(rest, nil)); err != nil {
			return err
		}
	}
	final := c.chunk("", &finish)
	if !c.usage {
		s := tr.Summary()
		final.PDServe = &s
	}
	if err := c.sse.event(final); err != nil {
		return err
	}
	if c.usage {
		s := tr.Summary()
		u := c.usageChunk()
		u.PDServe = &s
		if err := c.sse.event(u); err != nil {
			return err
		}
	}
	return c.sse.done()
}

// fail reports a Backend error: as the response when nothing was sent yet,
// else as an error event ending the stream.
func (c *call) fail(w http.ResponseWriter, ctx context.Context, err error) {
	tr := c.req.Trace
	aerr := backendError(err)
	switch {
	case ctx.Err() != nil, c.writeErr != nil:
		tr.Status = budget.StatusCancelled
	case !tr.FirstToken.IsZero():
		tr.Status = budget.StatusError // failed after output began
	case aerr.status == http.StatusTooManyRequests:
		tr.Status = budget.StatusRejected
	case aerr.status == http.StatusServiceUnavailable:
		tr.Status = budget.StatusUnavailable
	case aerr.status < 500:
		tr.Status = budget.StatusInvalid
	default:
		tr.Status = budget.StatusError
	}
	defer c.s.finish(tr, aerr)
	if tr.Status == budget.StatusCancelled {
		return // nobody to tell
	}
	if !c.sse.started {
		writeError(w, aerr, c.s.o.RetryAfter)
		return
	}
	_ = c.sse.event(struct {
		Error *apiError `json:"error"`
	}{aerr})
	_ = c.sse.done()
}

// finish logs the request line and observes its metrics.
func (s *Server) finish(tr *budget.Trace, aerr *apiError) {
	fields := tr.Fields()
	if aerr != nil {
		fields = append(fields, zap.Int("http_status", aerr.status), zap.String("error", aerr.Message))
		if aerr.cause != nil {
			fields = append(fields, zap.NamedError("cause", aerr.cause))
		}
	}
	s.o.Logger.Info("request", fields...)
	s.o.Metrics.ObserveRequest(tr)
}

func apiKey(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if k, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(k)
	}
	return ""
}

// newID returns 24 random hex characters.
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
