package frontend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/internal/poll"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// A body that makes no progress for BodyIdleTimeout gets 408 and is
// logged; once the body is read, a response may idle longer than that.
func TestBodyIdleTimeout(t *testing.T) {
	const idle = 100 * time.Millisecond
	core, logs := observer.New(zap.InfoLevel)
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		if err := emit(Output{Tokens: []int32{'a'}}); err != nil {
			return nil, err
		}
		select { // a response stream idle for three body timeouts
		case <-time.After(3 * idle):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if err := emit(Output{Tokens: []int32{'b'}}); err != nil {
			return nil, err
		}
		return []string{"length"}, nil
	}}, func(o *Options) {
		o.BodyIdleTimeout = idle
		o.Logger = zap.New(core)
	})

	t.Run("stalled body", func(t *testing.T) {
		conn := rawRequest(t, ts, RouteCompletions, 100)
		if _, err := io.WriteString(conn, `{"prompt":`); err != nil {
			t.Fatal(err)
		}
		resp := readResponse(t, conn) // the server gives up after idle
		if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
			t.Errorf("status %d close %v, want 408 and the connection closed", resp.StatusCode, resp.Close)
		}
		if e := errorBody(t, resp); deref(e.Code) != "timeout" {
			t.Errorf("error %+v, want code timeout", e)
		}
		lines := logs.FilterMessage("request").All()
		if len(lines) != 1 || lines[0].ContextMap()["http_status"] != int64(http.StatusRequestTimeout) {
			t.Errorf("request log %v, want one line with http_status 408", lines)
		}
	})
	t.Run("idle stream is not cut", func(t *testing.T) {
		resp := ts.post(t, RouteCompletions, `{"prompt":"x","stream":true}`)
		var text strings.Builder
		for _, ch := range streamed(t, resp) {
			text.WriteString(choice0(t, ch)["text"].(string))
		}
		if text.String() != "ab" {
			t.Errorf("streamed %q, want both tokens", text.String())
		}
	})
}

// Admission comes before the body is read: while a request whose body is
// still unsent holds the only slot, the next gets 429 before sending its
// own body.
func TestAdmissionBeforeBody(t *testing.T) {
	var calls atomic.Int32
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		calls.Add(1)
		return echoText("ok")(ctx, req, emit)
	}}, func(o *Options) { o.MaxInFlight = 1 })
	release := holdSlots(t, ts, 1)

	second := rawRequest(t, ts, RouteCompletions, 1000) // no body sent
	resp := readResponse(t, second)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("second request: status %d Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if e := errorBody(t, resp); deref(e.Code) != "overloaded" || !strings.Contains(e.Message, "queue limit") {
		t.Errorf("error %+v, want overloaded naming the queue limit", e)
	}
	release()
	ts.idle(t)
	if resp := ts.post(t, RouteCompletions, `{"prompt":"a"}`); resp.StatusCode != http.StatusOK {
		t.Errorf("after the release: status %d", resp.StatusCode)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("backend called %d times, want the held and the last request", n)
	}
	if got := requestsTotal(t, ts.reg, "rejected"); got != 1 {
		t.Errorf("requests_total{status=rejected} = %v, want 1", got)
	}
}

// countingListener counts the bytes read from each accepted connection.
type countingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*countingConn
}

type countingConn struct {
	net.Conn
	n atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &countingConn{Conn: c}
	l.mu.Lock()
	l.conns = append(l.conns, cc)
	l.mu.Unlock()
	return cc, nil
}

// readAtLeast returns the number of connections that read at least n bytes.
func (l *countingListener) readAtLeast(n int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := 0
	for _, c := range l.conns {
		if c.n.Load() >= n {
			k++
		}
	}
	return k
}

// TestBodyMemoryBounded opens 1,000 concurrent uploads of 16 MiB bodies
// that stall one byte short of their end, against a server admitting 4:
// the rest get 429 before their body is read, and the heap stays under
// 4 × 16 MiB plus slack.
func TestBodyMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 uploads")
	}
	const (
		clients  = 1000
		inFlight = 4
		limit    = 16 << 20
		slack    = 32 << 20
	)
	pol := config.Default()
	s, err := New(Options{
		Backend: &fakeBackend{complete: echoText("x")}, Tokenizer: tokenizer.Bytes{}, Policy: pol,
		Models:      func() []Model { return []Model{{Name: "tiny", MaxModelLen: 1024}} },
		MaxInFlight: inFlight, MaxBodyBytes: limit, BodyIdleTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(s)
	cl := &countingListener{Listener: hs.Listener}
	hs.Listener = cl
	hs.Start()
	defer hs.Close()

	chunk := []byte(strings.Repeat("x", 64<<10)) // shared, read only
	release := make(chan struct{})
	var once sync.Once
	releaseAll := func() { once.Do(func() { close(release) }) }
	defer releaseAll() // before hs.Close, which waits for the handlers
	var wg sync.WaitGroup
	var rejected, admitted atomic.Int32
	for range clients {
		wg.Go(func() {
			conn, err := net.Dial("tcp", hs.Listener.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", RouteCompletions, limit)
			var writer sync.WaitGroup
			writer.Go(func() { // all but the last byte, then stall until released
				for left := limit - 1; left > 0; {
					n, err := conn.Write(chunk[:min(left, len(chunk))])
					if err != nil {
						return // refused and closed
					}
					left -= n
				}
				<-release
				_, _ = conn.Write([]byte("x"))
			})
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err == nil {
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusTooManyRequests:
					rejected.Add(1)
				case http.StatusBadRequest: // the body is not JSON
					admitted.Add(1)
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}
			conn.Close()
			writer.Wait()
		})
	}
	poll.CheckFor(t, 2*time.Minute, 5*time.Millisecond, func() error {
		if n := rejected.Load(); n != clients-inFlight {
			return fmt.Errorf("%d refusals of %d", n, clients-inFlight)
		}
		if n := cl.readAtLeast(limit - 1); n != inFlight {
			return fmt.Errorf("%d of %d admitted bodies read", n, inFlight)
		}
		return nil
	})
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("HeapInuse %.1f MiB with %d bodies of %d MiB in flight (bound %d MiB)", float64(ms.HeapInuse)/(1<<20), inFlight, limit>>20, (inFlight*limit+slack)>>20)
	if ms.HeapInuse > inFlight*limit+slack {
		t.Errorf("HeapInuse %d bytes, over %d in flight × %d + %d", ms.HeapInuse, inFlight, limit, slack)
	}
	releaseAll()
	wg.Wait()
	if n := admitted.Load(); n != inFlight {
		t.Errorf("%d admitted bodies answered, want %d", n, inFlight)
	}
}

// TestMaxTokensDefault: without max_tokens a request gets the rest of the
// context, lowered to the policy's default and cap; with it, the cap and
// the context bound it.
func TestMaxTokensDefault(t *testing.T) {
	tests := []struct {
		name           string
		maxLen         int
		limits         config.Limits
		body           string // prompt "abcd": 4 tokens
		want           int
		code, param    string
		wantMessageHas string
	}{
		{name: "rest of the context", maxLen: 20, body: `{}`, want: 16},
		{name: "capped", maxLen: 20, limits: config.Limits{MaxTokensCap: 10}, body: `{}`, want: 10},
		{name: "default override", maxLen: 20, limits: config.Limits{DefaultMaxTokens: 5}, body: `{}`, want: 5},
		{name: "default override over the rest", maxLen: 6, limits: config.Limits{DefaultMaxTokens: 5}, body: `{}`, want: 2},
		{name: "unknown context", body: `{}`, want: UnknownContextMaxTokens},
		{name: "unknown context, capped", limits: config.Limits{MaxTokensCap: 8}, body: `{}`, want: 8},
		{name: "unknown context, default", limits: config.Limits{DefaultMaxTokens: 100}, body: `{}`, want: 100},
		{name: "asked", maxLen: 20, body: `{"max_tokens":7}`, want: 7},
		{name: "asked over the cap", maxLen: 20, limits: config.Limits{MaxTokensCap: 5}, body: `{"max_tokens":7}`, code: "max_tokens_over_cap", param: "max_tokens"},
		{name: "asked over the context", maxLen: 10, body: `{"max_tokens":7}`, code: "context_length_exceeded", param: "prompt"},
		{name: "prompt fills the context", maxLen: 4, body: `{}`, code: "context_length_exceeded", param: "prompt", wantMessageHas: "maximum context length is 4 tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got int
			ts := newTestServer(t, &fakeBackend{complete: func(_ context.Context, req *Request, _ EmitFunc) ([]string, error) {
				got = req.MaxTokens
				return finishes(req, "stop"), nil
			}}, func(o *Options) {
				o.Policy.Limits = tc.limits
				o.Policy.Limits.QueueLimit = 1
				o.Models = func() []Model { return []Model{{Name: "m", MaxModelLen: tc.maxLen}} }
			})
			body := strings.Replace(tc.body, "{", `{"prompt":"abcd",`, 1)
			body = strings.Replace(body, ",}", "}", 1)
			resp := ts.post(t, RouteCompletions, body)
			if tc.code == "" {
				if resp.StatusCode != http.StatusOK || got != tc.want {
					t.Errorf("status %d MaxTokens %d, want 200 and %d", resp.StatusCode, got, tc.want)
				}
				return
			}
			e := errorBody(t, resp)
			if resp.StatusCode != http.StatusBadRequest || deref(e.Code) != tc.code || deref(e.Param) != tc.param || !strings.Contains(e.Message, tc.wantMessageHas) {
				t.Errorf("status %d error %+v, want 400 %s on %s", resp.StatusCode, e, tc.code, tc.param)
			}
		})
	}
}

// Unseeded requests get a random seed each; a seeded one keeps its seed.
func TestSeeds(t *testing.T) {
	var mu sync.Mutex
	var seeds []uint64
	ts := newTestServer(t, &fakeBackend{complete: func(_ context.Context, req *Request, _ EmitFunc) ([]string, error) {
		mu.Lock()
		seeds = append(seeds, req.Sampling.Seed)
		mu.Unlock()
		return finishes(req, "stop"), nil
	}}, nil)
	for _, body := range []string{`{"prompt":"a"}`, `{"prompt":"a"}`, `{"prompt":"a","seed":42}`, `{"prompt":"a","seed":42}`} {
		if resp := ts.post(t, RouteCompletions, body); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if seeds[0] == seeds[1] || seeds[2] != 42 || seeds[3] != 42 {
		t.Errorf("seeds %v, want two different random ones, then 42 twice", seeds)
	}
}

// A stop string ends only its own choice.
func TestStopPerChoice(t *testing.T) {
	texts := []string{"abSTOPcd", "abcdef"}
	ts := newTestServer(t, &fakeBackend{complete: func(_ context.Context, req *Request, emit EmitFunc) ([]string, error) {
		out := finishes(req, "length")
		for k := range len(texts[1]) {
			for j, text := range texts {
				if out[j] == "stop" {
					continue
				}
				err := emit(Output{Index: j, Tokens: []int32{int32(text[k])}})
				if errors.Is(err, ErrStopped) {
					out[j] = "stop"
				} else if err != nil {
					return nil, err
				}
			}
		}
		return out, nil
	}}, nil)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			resp := ts.post(t, RouteCompletions, fmt.Sprintf(`{"prompt":"x","n":2,"stop":"STOP","stream":%v}`, stream))
			text, finish := map[float64]string{}, map[float64]any{}
			if stream {
				for _, ch := range streamed(t, resp) {
					c := choice0(t, ch)
					text[c["index"].(float64)] += c["text"].(string)
					if c["finish_reason"] != nil {
						finish[c["index"].(float64)] = c["finish_reason"]
					}
				}
			} else {
				for _, c := range choices(t, decodeJSON(t, resp.Body)) {
					text[c["index"].(float64)], finish[c["index"].(float64)] = c["text"].(string), c["finish_reason"]
				}
			}
			if diff := cmp.Diff(map[float64]string{0: "ab", 1: "abcdef"}, text); diff != "" {
				t.Errorf("texts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[float64]any{0: "stop", 1: "length"}, finish); diff != "" {
				t.Errorf("finish reasons (-want +got):\n%s", diff)
			}
		})
	}
}

// When one prompt of a batch fails, the others are cancelled, every
// prompt's Complete has returned before the response, the client gets a
// generic error, and each prompt has a log line of its own.
func TestBatchedFailure(t *testing.T) {
	ended := make(chan error, 1)
	core, logs := observer.New(zap.InfoLevel)
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		if req.Prompt[0] == 'a' {
			return nil, errors.New("worker 10.1.2.3 crashed")
		}
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}}, func(o *Options) { o.Logger = zap.New(core) })
	resp := ts.post(t, RouteCompletions, `{"prompt":["a","b"]}`)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("status %d, want 500", resp.StatusCode)
	}
	if e := errorBody(t, resp); strings.Contains(e.Message, "10.1.2.3") || deref(e.Code) != "internal_error" {
		t.Errorf("error %+v, want a generic internal_error", e)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("other prompt ended with %v", err)
		}
	default:
		t.Error("the response came before the other prompt's Complete returned")
	}
	id := resp.Header.Get("X-Request-Id")
	var got []string
	for _, l := range logs.FilterMessage("request").All() {
		f := l.ContextMap()
		got = append(got, fmt.Sprintf("%v %v %v %v", f["request_id"], f["batch_request_id"], f["status"], f["cause"] != nil))
	}
	want := []string{id + "-0 " + id + " error true", id + "-1 " + id + " error false"}
	if diff := cmp.Diff(want, sortedStrings(got)); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
}

// TestChatTemplateOverride: Options.ChatTemplate renders chats in place of
// the tokenizer's template (the backend sees its rendering), and one that
// does not compile fails New naming the template.
func TestChatTemplateOverride(t *testing.T) {
	var prompt string
	b := &fakeBackend{complete: func(ctx context.Context, r *Request, emit EmitFunc) ([]string, error) {
		prompt = (tokenizer.Bytes{}).Decode(r.Prompt)
		return echoText("x")(ctx, r, emit)
	}}
	ts := newTestServer(t, b, func(o *Options) {
		o.ChatTemplate = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
	})
	resp := ts.post(t, RouteChat, `{"model":"tiny","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":2}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if want := "[system] Be brief.\n[user] Hi\n[assistant]"; prompt != want {
		t.Errorf("rendered %q, want %q", prompt, want)
	}
	_, err := New(Options{Backend: b, Tokenizer: tokenizer.Bytes{}, Policy: config.Default(), ChatTemplate: "{% for m in messages %}"})
	if err == nil || !strings.Contains(err.Error(), "chat template") {
		t.Errorf("New with a template that does not compile: %v, want a chat template error", err)
	}
}
