package frontend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/respstore"
)

// ResponseStore keeps stored responses (*respstore.Store, on NATS
// JetStream). Get and Delete return an error wrapping
// respstore.ErrNotFound when owner has no response id.
type ResponseStore interface {
	Put(ctx context.Context, owner string, rec respstore.Record) error
	Get(ctx context.Context, owner, id string) (*respstore.Record, error)
	Delete(ctx context.Context, owner, id string) error
}

var _ ResponseStore = (*respstore.Store)(nil)

// storeTimeout bounds one call to the ResponseStore.
const storeTimeout = 5 * time.Second

// owner returns who owns the responses cl makes: the SHA-256 of its API
// key (of the bearer token it presented, or of none, without API keys).
func (cl client) owner() string {
	if cl.key != nil {
		d := cl.key.Digest()
		return hex.EncodeToString(d[:])
	}
	d := sha256.Sum256([]byte(cl.raw))
	return hex.EncodeToString(d[:])
}

// clientOf returns r's client.
func clientOf(r *http.Request) client {
	cl := client{key: keyOf(r), retry: retryOf(r)}
	if cl.key == nil {
		cl.raw = apiKey(r)
	}
	return cl
}

// inflight are the responses being generated on this replica, by id:
// what POST /v1/responses/{id}/cancel ends.
type inflight struct {
	mu  sync.Mutex
	ids map[string]inflightResp
}

type inflightResp struct {
	owner  string
	cancel context.CancelFunc
}

func (f *inflight) add(id, owner string, cancel context.CancelFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ids == nil {
		f.ids = map[string]inflightResp{}
	}
	f.ids[id] = inflightResp{owner: owner, cancel: cancel}
}

func (f *inflight) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ids, id)
}

// cancel ends owner's response id when it is in flight here.
func (f *inflight) cancel(id, owner string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.ids[id]
	if ok && r.owner == owner {
		r.cancel()
		return true
	}
	return false
}

// responses serves RouteResponses: POST creates a response, GET with
// an Upgrade opens a WebSocket (respws.go).
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	switch {
	case isUpgrade(r):
		s.responsesWS(w, r)
	case r.Method == http.MethodPost:
		s.createResponse(w, r, nil, nil)
	default:
		w.Header().Set("Allow", "POST, GET (WebSocket)")
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, Message: r.Method + " not allowed on " + r.URL.Path + "; use POST, or GET with a WebSocket upgrade", Type: "invalid_request_error"}, 0)
	}
}

// createResponse runs POST /v1/responses, or a WebSocket's
// response.create (sock not nil), whose events go to emit instead of SSE.
func (s *Server) createResponse(w http.ResponseWriter, r *http.Request, emit func(typ string, ev map[string]any) error, sock *wsSocket) {
	id := "resp_" + newID()
	cl := clientOf(r)
	owner := cl.owner()
	created := s.o.Now().Unix()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	s.inflight.add(id, owner, cancel)
	defer s.inflight.remove(id)
	r = r.WithContext(ctx)

	rw := &chatTap{w: w, rc: http.NewResponseController(w)}
	sink := &respSink{now: func() int64 { return s.o.Now().Unix() }, tokens: func(t string) int { return len(s.o.Tokenizer.Encode(t)) }}
	rw.sink = sink
	var rq *respRequest
	transform := func(data []byte, cl client) ([]byte, *apiError) {
		var aerr *apiError
		rq, aerr = parseResponses(data, func(prev string) ([]chatMsg, *apiError) {
			if sock != nil {
				if conv, ok := sock.conversation(prev); ok {
					return conv, nil // the socket's own: also with store false
				}
			}
			return s.conversation(ctx, owner, prev)
		})
		if aerr != nil {
			return nil, aerr
		}
		if rq.store && s.o.Responses == nil {
			rq.store = false // nothing to keep it in: the Response says so
		}
		if rq.model == "" {
			if ms := s.o.Models(); len(ms) > 0 {
				rq.model = ms[0].Name
			}
		}
		sink.respRun = newRespRun(rq, id, created)
		switch {
		case emit != nil: // a WebSocket's: always events
			sink.emit, rw.stream, rw.ws = emit, true, true
		case rq.stream:
			sink.emit, rw.stream = rw.sse, true
		}
		sink.onEnd = func(run *respRun) {
			if sock != nil {
				sock.remember(run.resp.ID, conversationOf(rq, run))
			}
			if rq.store {
				s.storeResponse(ctx, owner, rq, run)
			}
		}
		return rq.chat, nil
	}
	s.serve(rw, r, true, id, transform)

	switch {
	case rw.status == 0:
		return // the client went away
	case rw.status != http.StatusOK:
		s.writeRespError(w, rw)
	case !rw.stream:
		sink.onEnd = nil
		if err := rw.whole(); err != nil {
			writeError(w, &apiError{status: http.StatusInternalServerError, Message: "The response could not be built.", Type: "server_error"}, 0)
			return
		}
		run := sink.respRun
		if rq.store {
			s.storeResponse(ctx, owner, rq, run)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(run.snapshot())
	}
}

// writeRespError sends the chat path's error of rw as the Responses
// API's: its param, and the parameters its message names, as this API
// names them.
func (s *Server) writeRespError(w http.ResponseWriter, rw *chatTap) {
	var body struct {
		Error *apiError `json:"error"`
	}
	if err := json.Unmarshal(rw.body.Bytes(), &body); err != nil || body.Error == nil {
		w.WriteHeader(rw.status)
		_, _ = w.Write(rw.body.Bytes())
		return
	}
	mapError(body.Error)
	w.WriteHeader(rw.status)
	_ = json.NewEncoder(w).Encode(body)
}

// conversation returns the messages a continuation of owner's response
// id goes on from; a 404 when the store has none (another key's, expired,
// lost: never another conversation).
func (s *Server) conversation(ctx context.Context, owner, id string) ([]chatMsg, *apiError) {
	rec, aerr := s.loadResponse(ctx, owner, id, "previous_response_id")
	if aerr != nil {
		return nil, aerr
	}
	var msgs []chatMsg
	if err := json.Unmarshal(rec.Conversation, &msgs); err != nil {
		return nil, respNotFound("previous_response_id", id)
	}
	return msgs, nil
}

// loadResponse returns owner's stored response id, or the 404 naming
// param (503 when the store cannot be reached).
func (s *Server) loadResponse(ctx context.Context, owner, id, param string) (*respstore.Record, *apiError) {
	if s.o.Responses == nil {
		return nil, respNotFound(param, id)
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	rec, err := s.o.Responses.Get(ctx, owner, id)
	switch {
	case errors.Is(err, respstore.ErrNotFound):
		return nil, respNotFound(param, id)
	case err != nil:
		s.o.Logger.Warn("stored responses unreachable", zap.String("response_id", id), zap.Error(err))
		return nil, &apiError{status: http.StatusServiceUnavailable, Message: "Stored responses cannot be reached; retry later.", Type: "service_unavailable", Code: ptr("store_unavailable")}
	}
	return rec, nil
}

// storeResponse keeps run's Response for owner, with the conversation a
// continuation goes on from. A failure is logged: the client has its
// response; a later read of it gets 404.
func (s *Server) storeResponse(ctx context.Context, owner string, rq *respRequest, run *respRun) {
	conv := conversationOf(rq, run)
	resp, err1 := json.Marshal(run.snapshot())
	input, err2 := json.Marshal(rq.items)
	cv, err3 := json.Marshal(conv)
	if err := errors.Join(err1, err2, err3); err != nil {
		s.o.Logger.Error("response not stored", zap.String("response_id", run.resp.ID), zap.Error(err))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	if err := s.o.Responses.Put(ctx, owner, respstore.Record{ID: run.resp.ID, CreatedAt: run.resp.CreatedAt, Response: resp, Input: input, Conversation: cv}); err != nil {
		s.o.Logger.Warn("response not stored", zap.String("response_id", run.resp.ID), zap.Error(err))
	}
}

// conversationOf returns the conversation a continuation of run goes on
// from: the earlier turns, this request's input and run's output
// (without instructions, which a continuation does not carry over).
func conversationOf(rq *respRequest, run *respRun) []chatMsg {
	conv := append(append([]chatMsg{}, rq.history...), rq.input...)
	out := chatMsg{Role: "assistant"}
	for _, it := range run.items {
		switch it.kind {
		case itemReasoning:
			out.Reasoning += it.text.String()
		case itemMessage:
			out.Content += it.text.String()
		case itemCall:
			out.ToolCalls = append(out.ToolCalls, chatToolCall{ID: it.callID, Type: "function", Function: toolFunction{Name: it.name, Arguments: it.text.String()}})
		}
	}
	return append(conv, out)
}

// responseByID serves GET and DELETE /v1/responses/{id}, GET
// /v1/responses/{id}/input_items and POST /v1/responses/{id}/cancel.
func (s *Server) responseByID(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, RouteResponses+"/")
	id, sub, _ := strings.Cut(rest, "/")
	owner := clientOf(r).owner()
	allow := map[string]string{"": "GET, DELETE", "input_items": "GET", "cancel": "POST"}[sub]
	if allow == "" {
		writeError(w, &apiError{status: http.StatusNotFound, Message: "no route " + r.URL.Path, Type: "not_found_error"}, 0)
		return
	}
	if !strings.Contains(allow, r.Method) || r.Method == "" {
		w.Header().Set("Allow", allow)
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, Message: r.Method + " not allowed on " + r.URL.Path + "; use " + allow, Type: "invalid_request_error"}, 0)
		return
	}
	if sub == "cancel" && s.inflight.cancel(id, owner) {
		// Its stream ends as cancelled; nothing of it is stored.
		writeJSON(w, map[string]any{"id": id, "object": "response", "status": "cancelled"})
		return
	}
	rec, aerr := s.loadResponse(r.Context(), owner, id, "response_id")
	if aerr != nil {
		writeError(w, aerr, s.o.RetryAfter)
		return
	}
	switch {
	case sub == "cancel":
		writeError(w, badRequest("response_id", "invalid_value", "Only a response in progress can be cancelled; %s has ended.", id), 0)
	case sub == "input_items":
		s.inputItems(w, r, rec)
	case r.Method == http.MethodDelete:
		ctx, cancel := context.WithTimeout(r.Context(), storeTimeout)
		defer cancel()
		if err := s.o.Responses.Delete(ctx, owner, id); err != nil {
			writeError(w, respNotFound("response_id", id), 0)
			return
		}
		writeJSON(w, map[string]any{"id": id, "object": "response.deleted", "deleted": true})
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(rec.Response)
	}
}

// inputItems lists a stored response's input items: limit 1..100 (20),
// order asc or desc (the default, as OpenAI's), after an item id.
func (s *Server) inputItems(w http.ResponseWriter, r *http.Request, rec *respstore.Record) {
	var items []json.RawMessage
	if err := json.Unmarshal(rec.Input, &items); err != nil {
		writeError(w, respNotFound("response_id", rec.ID), 0)
		return
	}
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "limit", "order", "after", "include":
		default:
			writeError(w, badRequest(k, "unknown_parameter", "Unrecognized query parameter: %s", k), 0)
			return
		}
	}
	if len(q["include"]) > 0 {
		writeError(w, unsupported("include", "include is not supported"), 0)
		return
	}
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeError(w, badRequest("limit", "invalid_value", "limit must be an integer in 1..100"), 0)
			return
		}
		limit = n
	}
	switch q.Get("order") {
	case "", "desc":
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	case "asc":
	default:
		writeError(w, badRequest("order", "invalid_value", `order must be "asc" or "desc"`), 0)
		return
	}
	idOf := func(it json.RawMessage) string {
		var x struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(it, &x)
		return x.ID
	}
	if after := q.Get("after"); after != "" {
		i := slices.IndexFunc(items, func(it json.RawMessage) bool { return idOf(it) == after })
		items = items[i+1:] // none after an id that is not there
		if i < 0 {
			items = nil
		}
	}
	more := len(items) > limit
	if more {
		items = items[:limit]
	}
	out := map[string]any{"object": "list", "data": items, "has_more": more, "first_id": nil, "last_id": nil}
	if len(items) > 0 {
		out["first_id"], out["last_id"] = idOf(items[0]), idOf(items[len(items)-1])
	} else {
		out["data"] = []json.RawMessage{}
	}
	writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
