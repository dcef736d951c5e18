package ssetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// Clock is a fake clock; Now records that the time was read. Safe for
// concurrent use.
type Clock struct {
	mu    sync.Mutex
	now   time.Time
	reads int
	cond  *sync.Cond
}

// NewClock returns a clock at t.
func NewClock(t time.Time) *Clock {
	c := &Clock{now: t}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// Now returns the time and counts the read.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	c.cond.Broadcast()
	return c.now
}

// Peek returns the time without counting a read.
func (c *Clock) Peek() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t and returns the read count at that moment.
func (c *Clock) Set(t time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	return c.reads
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// SleepUntil moves the clock to t when t is later (virtual time passes at
// once); it returns ctx's error if ctx is done.
func (c *Clock) SleepUntil(ctx context.Context, t time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	return nil
}

// waitRead blocks until the read count exceeds n, ctx is done or the
// deadline passes; it reports whether a read happened.
func (c *Clock) waitRead(ctx context.Context, n int, deadline time.Duration) bool {
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.cond.Broadcast()
	})
	defer stop()
	timer := time.AfterFunc(deadline, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.cond.Broadcast()
	})
	defer timer.Stop()
	end := time.Now().Add(deadline)
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.reads <= n {
		if ctx.Err() != nil || !time.Now().Before(end) {
			return false
		}
		c.cond.Wait()
	}
	return true
}

// Event is one SSE data line at a scripted time after the request reached
// the server.
type Event struct {
	At   time.Duration
	Data string // the payload after "data: "; "[DONE]" ends the stream
}

// Script is the response to one request.
type Script struct {
	// Status, when not 0 or 200, is sent with Body instead of a stream.
	Status int
	Body   string
	// Events are sent in order; At must not decrease.
	Events []Event
	// JSON, when set, is sent as a non-streaming response at JSONAt.
	JSON   string
	JSONAt time.Duration
}

// Request is what the server received.
type Request struct {
	Path string
	Body map[string]any
}

// Server is an httptest server that answers each POST with the Script its
// Pick function returns.
type Server struct {
	*httptest.Server
	Clock *Clock
	t     testing.TB
	pick  func(Request) Script
	mu    sync.Mutex
	reqs  []Request
}

// readWait bounds how long the server waits for the client to read an event
// before failing the test (a client that never stamps an event is a bug).
const readWait = 10 * time.Second

// NewServer starts a server whose responses come from pick; it is closed
// when the test ends.
func NewServer(t testing.TB, clock *Clock, pick func(Request) Script) *Server {
	s := &Server{Clock: clock, t: t, pick: pick}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req := Request{Path: r.URL.Path}
	if err := json.Unmarshal(raw, &req.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	sc := s.pick(req)
	base := s.Clock.Peek()
	if sc.Status != 0 && sc.Status != http.StatusOK {
		http.Error(w, sc.Body, sc.Status)
		return
	}
	if sc.JSON != "" {
		// The client reads the whole body before stamping it, so the
		// handler must return first; nothing moves the clock meanwhile.
		s.Clock.Set(base.Add(sc.JSONAt))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, sc.JSON)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for _, ev := range sc.Events {
		n := s.Clock.Set(base.Add(ev.At))
		fmt.Fprintf(w, "data: %s\n\n", ev.Data)
		w.(http.Flusher).Flush()
		if !s.waitRead(r.Context(), n) {
			return
		}
	}
}

func (s *Server) waitRead(ctx context.Context, n int) bool {
	if s.Clock.waitRead(ctx, n, readWait) {
		return true
	}
	if ctx.Err() == nil {
		s.t.Errorf("ssetest: the client did not read the clock within %v of an event", readWait)
	}
	return false
}

// Token is one streamed token of a scripted completion.
type Token struct {
	At        time.Duration
	Text      string
	Reasoning bool // a reasoning token (chat only)
}

// Stream builds the events of a streamed completion: one chunk per token,
// then (at end) a chunk with finish_reason "length", the usage (when usage
// ≥ 0) and the budget object (when not nil), then [DONE].
func Stream(chat bool, tokens []Token, end time.Duration, usage int, budget map[string]any) []Event {
	var evs []Event
	for _, tk := range tokens {
		var c map[string]any
		switch {
		case !chat:
			c = map[string]any{"index": 0, "text": tk.Text, "finish_reason": nil}
		case tk.Reasoning:
			c = map[string]any{"index": 0, "delta": map[string]any{"reasoning_content": tk.Text}}
		default:
			c = map[string]any{"index": 0, "delta": map[string]any{"content": tk.Text}}
		}
		evs = append(evs, Event{At: tk.At, Data: mustJSON(map[string]any{"choices": []any{c}})})
	}
	last := map[string]any{"choices": []any{map[string]any{"index": 0, "text": "", "finish_reason": "length"}}}
	if chat {
		last["choices"] = []any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": "length"}}
	}
	if usage >= 0 {
		last["usage"] = map[string]any{"prompt_tokens": 0, "completion_tokens": usage, "total_tokens": usage}
	}
	if budget != nil {
		last["pdserve"] = budget
	}
	evs = append(evs, Event{At: end, Data: mustJSON(last)}, Event{At: end, Data: "[DONE]"})
	return evs
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Ms is a shorthand for n milliseconds.
func Ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
