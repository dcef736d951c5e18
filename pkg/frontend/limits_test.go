package frontend

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdserve/pdserve/pkg/apikey"
	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/tokenizer"
)

// TestBodyLimits: a prompt, a batch or messages over the bounds known
// before decoding (the longest context, the batch limit) are refused by
// the scan, and any other array or object is bounded.
func TestBodyLimits(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("x")}, func(o *Options) {
		o.MaxInFlight = 8
		o.Policy.Budgets = config.Budgets{}
		o.Models = func() []Model { return []Model{{Name: "tiny", MaxModelLen: 100}, {Name: "big", MaxModelLen: 200}} }
	})
	ids := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("1,", n), ",") + "]" }
	msgs := strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"a"},`, 201), ",")
	for _, tc := range []struct {
		name, path, body  string
		status            int
		code, param, want string
	}{
		{"ids over the longest context", RouteCompletions, `{"prompt":` + ids(201) + `}`, 400, "context_length_exceeded", "prompt", "prompt has more than 200 tokens"},
		{"ids over the model's context", RouteCompletions, `{"model":"tiny","prompt":` + ids(150) + `}`, 400, "context_length_exceeded", "prompt", "maximum context length is 100"},
		{"a batched prompt over it", RouteCompletions, `{"prompt":[[1],` + ids(201) + `]}`, 400, "context_length_exceeded", "prompt", "prompt 1 has more than 200 tokens"},
		{"more prompts than admitted", RouteCompletions, `{"prompt":[` + strings.TrimSuffix(strings.Repeat("[1],", 9), ",") + `]}`, 400, "invalid_value", "prompt", "more than 8 prompts"},
		{"more texts than admitted", RouteCompletions, `{"prompt":[` + strings.TrimSuffix(strings.Repeat(`"a",`, 9), ",") + `]}`, 400, "invalid_value", "prompt", "more than 8 prompts"},
		{"more messages than the context", RouteChat, `{"messages":[` + msgs + `]}`, 400, "context_length_exceeded", "messages", "more than 200 messages"},
		{"a huge logit_bias", RouteCompletions, `{"prompt":"a","logit_bias":{` + strings.TrimSuffix(strings.Repeat(`"1":1,`, maxElems+1), ",") + `}}`, 400, "invalid_value", "logit_bias", "more than 4096"},
		{"a huge tools array", RouteChat, `{"messages":[{"role":"user","content":"a"}],"tools":[` + strings.TrimSuffix(strings.Repeat(`{},`, maxElems+1), ",") + `]}`, 400, "invalid_value", "tools", "more than 4096"},
		{"ids at the limit", RouteCompletions, `{"model":"big","prompt":` + ids(199) + `,"max_tokens":1}`, 200, "", "", ""},
		{"eight prompts", RouteCompletions, `{"prompt":[` + strings.TrimSuffix(strings.Repeat("[1],", 8), ",") + `],"max_tokens":1}`, 200, "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := ts.post(t, tc.path, tc.body)
			if resp.StatusCode != tc.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == 200 {
				return
			}
			e := errorBody(t, resp)
			if deref(e.Code) != tc.code || deref(e.Param) != tc.param || !strings.Contains(e.Message, tc.want) {
				t.Errorf("error %q (code %q, param %q), want code %q, param %q, holding %q", e.Message, deref(e.Code), deref(e.Param), tc.code, tc.param, tc.want)
			}
		})
	}
}

// TestDecodePrompts: the prompt decoder takes the shapes the API
// defines and refuses the others as before.
func TestDecodePrompts(t *testing.T) {
	ids := func(v ...int32) promptIn { return promptIn{ids: v, isIDs: true} }
	text := func(s string) promptIn { return promptIn{text: s} }
	for _, tc := range []struct {
		in   string
		want []promptIn
		code string
	}{
		{in: `"hello"`, want: []promptIn{text("hello")}},
		{in: `"caf\u00e9 \"x\""`, want: []promptIn{text(`café "x"`)}},
		{in: `[1, 2 ,3]`, want: []promptIn{ids(1, 2, 3)}},
		{in: ` [ 2147483647 ] `, want: []promptIn{ids(math.MaxInt32)}},
		{in: `[[1],[2, 3]]`, want: []promptIn{ids(1), ids(2, 3)}},
		{in: `[[]]`, want: []promptIn{{ids: []int32{}, isIDs: true}}},
		{in: `["a", "b\n"]`, want: []promptIn{text("a"), text("b\n")}},
		{in: `[]`, code: "empty_prompt"},
		{in: `[null]`, code: "invalid_type"},
		{in: `[1.5]`, code: "invalid_type"},
		{in: `[1e3]`, code: "invalid_type"},
		{in: `[true]`, code: "invalid_type"},
		{in: `[-1]`, code: "invalid_token"},
		{in: `[2147483648]`, code: "invalid_token"},
		{in: `[99999999999999999999999]`, code: "invalid_token"},
		{in: `[["a"]]`, code: "invalid_type"},
		{in: `["a",[1]]`, code: "invalid_type"},
		{in: `[[1],"a"]`, code: "invalid_type"},
		{in: `[[1],2]`, code: "invalid_type"},
		{in: `[1,[2]]`, code: "invalid_type"},
		{in: `{"a":1}`, code: "invalid_type"},
		{in: `7`, code: "invalid_type"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			p, aerr := parseBody([]byte(`{"prompt":`+tc.in+`}`), false, bodyLimits{prompts: 8})
			if tc.code != "" {
				if aerr == nil || deref(aerr.Code) != tc.code || deref(aerr.Param) != "prompt" {
					t.Fatalf("error %+v, want code %q on prompt", aerr, tc.code)
				}
				return
			}
			if aerr != nil {
				t.Fatalf("error %+v", aerr)
			}
			if diff := cmp.Diff(tc.want, p.prompts, cmp.AllowUnexported(promptIn{})); diff != "" {
				t.Errorf("prompts (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMaxTokensOverflow: a max_tokens near 2⁶³ neither wraps the context
// check nor the token budget: 400 context_length_exceeded naming the
// parameter, and nothing is taken from the key's tokens a minute.
func TestMaxTokensOverflow(t *testing.T) {
	keys := loadKeys(t, keyFile(t, keyTeamA+" name=team-a tpm=1000"))
	ts := newTestServer(t, &fakeBackend{complete: echoText("x")}, func(o *Options) {
		o.APIKeys = keys
		o.Policy.Limits.MaxTokensCap = 0
		o.Models = func() []Model { return []Model{{Name: "tiny", MaxModelLen: 1024}, {Name: "open"}} }
	})
	huge := strconv.FormatInt(math.MaxInt64, 10)
	for _, tc := range []struct {
		name, path, body, code, param string
	}{
		{"max_tokens 2^63-1", RouteCompletions, `{"prompt":"hello","max_tokens":` + huge + `}`, "context_length_exceeded", "max_tokens"},
		{"max_tokens 2^32+1", RouteCompletions, `{"prompt":"hello","max_tokens":4294967297}`, "context_length_exceeded", "max_tokens"},
		{"max_tokens the context", RouteCompletions, `{"prompt":"hello","max_tokens":1024}`, "context_length_exceeded", "max_tokens"},
		{"max_completion_tokens 2^63-1", RouteChat, `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":` + huge + `}`, "context_length_exceeded", "max_completion_tokens"},
		{"chat max_tokens 2^63-1", RouteChat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":` + huge + `}`, "context_length_exceeded", "max_tokens"},
		{"unknown context", RouteCompletions, `{"model":"open","prompt":"hello","max_tokens":` + huge + `}`, "invalid_value", "max_tokens"},
		{"unknown context, just over int32", RouteCompletions, `{"model":"open","prompt":"hello","max_tokens":2147483643}`, "invalid_value", "max_tokens"},
		{"over int64", RouteCompletions, `{"prompt":"hello","max_tokens":9223372036854775808}`, "invalid_type", "max_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := ts.post(t, tc.path, tc.body, "Authorization", "Bearer "+keyTeamA)
			if resp.StatusCode != 400 {
				t.Fatalf("status %d, want 400", resp.StatusCode)
			}
			if e := errorBody(t, resp); deref(e.Code) != tc.code || deref(e.Param) != tc.param {
				t.Errorf("error %q (code %q, param %q), want %q on %q", e.Message, deref(e.Code), deref(e.Param), tc.code, tc.param)
			}
			if got := resp.Header.Get("x-ratelimit-remaining-tokens"); got != "" && got != "1000" {
				t.Errorf("remaining tokens %s after a refused request, want 1000", got)
			}
		})
	}
	// The largest that fits an unknown context is taken, and fits int32.
	resp := ts.post(t, RouteCompletions, `{"model":"open","prompt":"hello","max_tokens":2147483642}`, "Authorization", "Bearer "+keyTeamA)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "" {
		t.Errorf("status %d, Retry-After %q: want 429 (over the key's whole TPM) without Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// FuzzTokenBudget drives the limit and budget path (max_tokens, n, the
// context, the cap, a batch, the key's tokens a minute) with arbitrary
// numbers: what it admits fits the context and the RPCs' int32 and takes
// exactly its tokens; nothing wraps.
func FuzzTokenBudget(f *testing.F) {
	f.Add(int64(5), int64(10), uint8(1), uint16(1024), uint16(0), uint8(1), uint32(1000))
	f.Add(int64(5), int64(math.MaxInt64), uint8(1), uint16(1024), uint16(0), uint8(1), uint32(1000))
	f.Add(int64(1), int64(math.MaxInt32), uint8(128), uint16(0), uint16(0), uint8(3), uint32(apikey.MaxLimit))
	f.Add(int64(100), int64(1<<62), uint8(64), uint16(0), uint16(64), uint8(8), uint32(0))
	f.Add(int64(900), int64(124), uint8(2), uint16(1024), uint16(0), uint8(2), uint32(2500))
	f.Add(int64(-3), int64(-1), uint8(0), uint16(1), uint16(1), uint8(0), uint32(1))
	f.Fuzz(func(t *testing.T, promptLen, maxTokens int64, n uint8, maxLen, maxCap uint16, prompts uint8, tpm uint32) {
		if promptLen < 1 || promptLen > 2048 || prompts < 1 || prompts > 8 {
			return // the body's size bounds these; the numbers are the point
		}
		pol := config.Default()
		pol.Limits.MaxTokensCap = int(maxCap)
		s, err := New(Options{
			Backend: &fakeBackend{complete: echoText("x")}, Tokenizer: tokenizer.Bytes{}, Policy: pol,
			Models:      func() []Model { return []Model{{Name: "m", MaxModelLen: int(maxLen)}} },
			MaxInFlight: 8,
		})
		if err != nil {
			t.Fatal(err)
		}
		one := "[" + strings.TrimSuffix(strings.Repeat("1,", int(promptLen)), ",") + "]"
		batch := strings.TrimSuffix(strings.Repeat(one+",", int(prompts)), ",")
		body := fmt.Sprintf(`{"prompt":[%s],"max_tokens":%d,"n":%d}`, batch, maxTokens, n)
		pl, aerr := s.prepare([]byte(body), false, client{}, &budget.Trace{RequestID: "cmpl-fuzz"})
		if aerr != nil {
			if aerr.status != http.StatusBadRequest {
				t.Fatalf("status %d: %+v", aerr.status, aerr)
			}
			return
		}
		want := 0
		for _, r := range pl.reqs {
			seq := len(r.Prompt) + r.MaxTokens
			switch {
			case r.MaxTokens < 1 || int64(r.MaxTokens) != maxTokens:
				t.Fatalf("MaxTokens %d for max_tokens %d", r.MaxTokens, maxTokens)
			case maxLen > 0 && seq > int(maxLen):
				t.Fatalf("prompt %d + max_tokens %d over the context %d", len(r.Prompt), r.MaxTokens, maxLen)
			case seq > MaxSequenceTokens || int(int32(seq)) != seq:
				t.Fatalf("prompt %d + max_tokens %d does not fit the RPCs' int32", len(r.Prompt), r.MaxTokens)
			case maxCap > 0 && r.MaxTokens > int(maxCap):
				t.Fatalf("max_tokens %d over the cap %d", r.MaxTokens, maxCap)
			}
			want += len(r.Prompt) + r.N*r.MaxTokens
		}
		if got := pl.tokens(); got != want || got <= 0 {
			t.Fatalf("tokens() %d, want %d", got, want)
		}
		if tpm == 0 || tpm > apikey.MaxLimit {
			return
		}
		path := keyFile(t, fmt.Sprintf("%s tpm=%d", keyTeamA, tpm))
		k := loadKeys(t, path).Authenticate(keyTeamA)
		q := k.TakeTokens(time.Unix(0, 0), pl.tokens())
		switch {
		case q.OK() != (pl.tokens() <= int(tpm)):
			t.Fatalf("take of %d from %d: ok %v", pl.tokens(), tpm, q.OK())
		case q.OK() && q.Tokens.Remaining != int(tpm)-pl.tokens():
			t.Fatalf("remaining %d after %d of %d", q.Tokens.Remaining, pl.tokens(), tpm)
		case !q.OK() && (q.Tokens.Remaining != int(tpm) || q.RetryAfter != 0):
			t.Fatalf("refused take of %d from %d left %d, retry %v", pl.tokens(), tpm, q.Tokens.Remaining, q.RetryAfter)
		}
	})
}

// TestNOverWorkerBatch: n above the workers' batch is refused at the
// frontend, naming n and the limit.
func TestNOverWorkerBatch(t *testing.T) {
	var calls atomic.Int32
	ts := newTestServer(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		calls.Add(1)
		return echoText("x")(ctx, req, emit)
	}}, func(o *Options) { o.MaxChoices = func() int { return 64 } })
	resp := ts.post(t, RouteCompletions, `{"prompt":"a","max_tokens":1,"n":65}`)
	if resp.StatusCode != 400 {
		t.Fatalf("status %d, want 400", resp.StatusCode)
	}
	if e := errorBody(t, resp); deref(e.Param) != "n" || !strings.Contains(e.Message, "1..64") {
		t.Errorf("error %q on %q, want one on n naming 1..64", e.Message, deref(e.Param))
	}
	if resp := ts.post(t, RouteCompletions, `{"prompt":"a","max_tokens":1,"n":64}`); resp.StatusCode != 200 {
		t.Errorf("n 64: status %d", resp.StatusCode)
	}
	if calls.Load() != 1 {
		t.Errorf("%d backend calls, want 1", calls.Load())
	}
}

// blockingBackend holds each request until release is closed.
func blockingBackend(started chan<- struct{}, release <-chan struct{}) Backend {
	return &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return echoText("x")(ctx, req, emit)
	}}
}

// TestBodyBudget: bodies in flight share MaxInFlightBodyBytes: one that
// does not fit gets 429 overloaded, by its Content-Length at admission
// or, without one, as its buffer grows; what a request held comes back
// when it ends.
func TestBodyBudget(t *testing.T) {
	started, release := make(chan struct{}, 4), make(chan struct{})
	ts := newTestServer(t, blockingBackend(started, release), func(o *Options) { o.MaxInFlightBodyBytes = 3000 })
	body := `{"prompt":"` + strings.Repeat("a", 60) + `","max_tokens":1,"stop":["` + strings.Repeat("z", 1900) + `"]}`
	done := make(chan int)
	go func() {
		resp, err := http.Post(ts.URL+RouteCompletions, "application/json", strings.NewReader(body))
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-started // the first holds its ~2000 bytes
	resp := ts.post(t, RouteCompletions, body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("second body: status %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if e := errorBody(t, resp); deref(e.Code) != "overloaded" {
		t.Errorf("code %q, want overloaded", deref(e.Code))
	}
	// Without Content-Length (chunked), the growing buffer is refused.
	req, _ := http.NewRequest(http.MethodPost, ts.URL+RouteCompletions, io.MultiReader(strings.NewReader(body)))
	req.ContentLength = -1
	if resp, err := ts.Client().Do(req); err != nil {
		t.Fatal(err)
	} else if resp.StatusCode != 429 {
		t.Errorf("chunked body: status %d, want 429", resp.StatusCode)
		resp.Body.Close()
	} else {
		resp.Body.Close()
	}
	close(release)
	if st := <-done; st != 200 {
		t.Fatalf("first request: status %d", st)
	}
	if got := ts.srv.heldBodyBytes(); got != 0 {
		t.Errorf("%d body bytes held after every request ended", got)
	}
	if resp := ts.post(t, RouteCompletions, body); resp.StatusCode != 200 {
		t.Errorf("after the first ended: status %d", resp.StatusCode)
	}
}

// TestBodyTimeout: a body trickled within the idle timeout still gets
// 408 at the overall deadline, and its admission slot comes back.
func TestBodyTimeout(t *testing.T) {
	ts := newTestServer(t, &fakeBackend{complete: echoText("x")}, func(o *Options) {
		o.MaxInFlight, o.BodyIdleTimeout, o.BodyTimeout = 1, 5*time.Second, 300*time.Millisecond
	})
	c, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", RouteCompletions)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := readStatusLine(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, " 408 ") {
		t.Fatalf("status line %q, want 408", line)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("408 after %v, want about 300ms", el)
	}
	waitFor(t, func() error {
		if resp := ts.post(t, RouteCompletions, `{"prompt":"a","max_tokens":1}`); resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

func readStatusLine(c net.Conn) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for {
		if _, err := c.Read(one); err != nil {
			return string(b), err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
}

// TestStalledClient: a client that stops reading its stream gets its
// request cancelled after the write timeout, counted in
// pdserve_stream_stalled_cancels_total.
func TestStalledClient(t *testing.T) {
	ended := make(chan error, 1)
	big := strings.Repeat("y", 1000)
	ts := newTestServerConfig(t, &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		ids := (tokenizer.Bytes{}).Encode(big)
		for {
			if err := emit(Output{Tokens: ids}); err != nil {
				ended <- err
				return nil, err
			}
		}
	}}, func(o *Options) {
		o.WriteTimeout = 200 * time.Millisecond
		o.Policy.Limits.MaxTokensCap = 0
	}, func(ts *httptest.Server) {
		// Small socket buffers on both ends, so that the server's writes
		// block after a few KiB whatever the CPU's speed: with the kernel's
		// autotuned loopback buffers (MiBs) filling them took most of the
		// test's time on a loaded machine.
		ts.Config.ConnState = func(c net.Conn, st http.ConnState) {
			if tc, ok := c.(*net.TCPConn); ok && st == http.StateNew {
				_ = tc.SetWriteBuffer(4096)
			}
		}
	})
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			// Before connect, so that the advertised window stays small.
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"prompt":"a","max_tokens":1000,"stream":true}`
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", RouteCompletions, len(body), body)
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("emit ended without an error")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the request of a client that stopped reading was not cancelled")
	}
	waitFor(t, func() error {
		if got := counterValue(t, ts.reg, "pdserve_stream_stalled_cancels_total"); got != 1 {
			return fmt.Errorf("pdserve_stream_stalled_cancels_total %v, want 1", got)
		}
		return nil
	})
}

// heldBodyBytes returns what bodies hold of the body budget.
func (s *Server) heldBodyBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bodyBytes
}

// counterValue returns the value of the counter name in reg, 0 when
// absent.
func counterValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestResponseCachePerKey: the response cache is partitioned by API key
// unless the policy shares it: another key's identical request misses.
func TestResponseCachePerKey(t *testing.T) {
	const keyTeamC = "sk-team-c-0123456789abcdef"
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared %v", shared), func(t *testing.T) {
			b := &countingBackend{}
			keys := loadKeys(t, keyFile(t, keyTeamA+" name=team-a", keyTeamC+" name=team-c"))
			ts, _ := cacheServer(t, b, 10, time.Minute, func(o *Options) {
				o.APIKeys = keys
				o.Policy.ResponseCache.ShareAcrossKeys = shared
			})
			const body = `{"prompt":"tenant a's secret","max_tokens":4,"temperature":0}`
			for i, key := range []string{keyTeamA, keyTeamA, keyTeamC} {
				resp := ts.post(t, RouteCompletions, body, "Authorization", "Bearer "+key)
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			want := int32(2) // team-a once, team-c once
			if shared {
				want = 1
			}
			if got := b.calls.Load(); got != want {
				t.Errorf("%d backend calls, want %d", got, want)
			}
		})
	}
}
