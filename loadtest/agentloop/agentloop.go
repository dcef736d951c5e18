package agentloop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Transports.
const (
	WS   = "ws"
	HTTP = "http"
)

// Options configure a run of loops.
type Options struct {
	// BaseURL is the server's root (http://host:port).
	BaseURL string
	// Model is the model name sent ("": none, the server's default).
	Model string
	// APIKey is sent as a bearer token ("": none).
	APIKey string
	// Loops run concurrently, each Turns turns (≥ 1).
	Loops, Turns int
	// MaxOutputTokens bounds each turn's output (max_output_tokens,
	// max_tokens): it must hold one call.
	MaxOutputTokens int
	// InstructionsBytes and ToolOutputBytes are the lengths of the
	// system prompt and of each tool output, in bytes of text.
	InstructionsBytes, ToolOutputBytes int
	// Temperature is the sampling temperature.
	Temperature float64
	// Seed and Tag make the prompt text: the same seed and tag give the
	// same prompts; another tag shares none of them.
	Seed uint64
	Tag  string
	// TurnTimeout bounds each turn (0: none).
	TurnTimeout time.Duration
	// HTTP is the client of the HTTP transport and of the WebSocket
	// upgrades (nil: one made for the run, keeping Loops connections).
	HTTP *http.Client
}

// Turn is what one turn measured.
type Turn struct {
	// TTFT: request written → first output event or chunk, client side.
	TTFT time.Duration `json:"-"`
	// Latency: request written → the turn's end.
	Latency time.Duration `json:"-"`
	// From the pdserve budget: the server's TTFT, the prompt tokens and
	// those taken from a prefix cache (the prefilling worker's hit), and
	// the worker that decoded.
	ServerTTFTMs    float64 `json:"server_ttft_ms"`
	PromptTokens    int     `json:"prompt_tokens"`
	PrefixHitTokens int     `json:"prefix_hit_tokens"`
	// DecodePrefixHitTokens are the prompt tokens whose KV the decode
	// worker held already (disaggregated: not sent again).
	DecodePrefixHitTokens int    `json:"decode_prefix_hit_tokens"`
	OutputTokens          int    `json:"output_tokens"`
	Worker                string `json:"worker"`
	// Mode is where the prompt was prefilled (the budget's mode:
	// disaggregated, local, colocated).
	Mode string `json:"mode"`
	// QueueMs and PrefillMs are the budget's queue and prefill terms.
	QueueMs   float64 `json:"queue_ms"`
	PrefillMs float64 `json:"prefill_ms"`
	// RequestBytes is the size of the request the client sent.
	RequestBytes int `json:"request_bytes"`
	// TTFTMs and LatencyMs are TTFT and Latency in milliseconds.
	TTFTMs    float64 `json:"ttft_ms"`
	LatencyMs float64 `json:"latency_ms"`
}

// Loop is one agent loop's outcome.
type Loop struct {
	Turns []Turn `json:"turns"`
	// E2E is the loop's time, first request to last turn's end.
	E2E   time.Duration `json:"-"`
	E2EMs float64       `json:"e2e_ms"`
	// Err is why the loop stopped before its last turn ("" when it
	// did not).
	Err string `json:"error,omitempty"`
}

// Validate reports unusable options.
func (o Options) Validate() error {
	var errs []error
	if o.BaseURL == "" {
		errs = append(errs, errors.New("no base URL"))
	}
	if o.Loops < 1 || o.Turns < 1 {
		errs = append(errs, fmt.Errorf("loops %d, turns %d: want both ≥ 1", o.Loops, o.Turns))
	}
	if o.MaxOutputTokens < 1 {
		errs = append(errs, fmt.Errorf("max output tokens %d: want ≥ 1", o.MaxOutputTokens))
	}
	if o.InstructionsBytes < 0 || o.ToolOutputBytes < 1 {
		errs = append(errs, fmt.Errorf("instructions %d bytes, tool output %d bytes: want ≥ 0 and ≥ 1", o.InstructionsBytes, o.ToolOutputBytes))
	}
	return errors.Join(errs...)
}

// Run runs o.Loops loops over transport (WS or HTTP) at once and returns
// them in loop order. A loop that fails stops there (Loop.Err); Run's
// error is for a bad transport or options, or ctx ending.
func Run(ctx context.Context, transport string, o Options) ([]Loop, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("agentloop: %w", err)
	}
	if transport != WS && transport != HTTP {
		return nil, fmt.Errorf("agentloop: transport %q: want %s or %s", transport, WS, HTTP)
	}
	o.BaseURL = strings.TrimRight(o.BaseURL, "/")
	if o.HTTP == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = o.Loops
		o.HTTP = &http.Client{Transport: tr}
		defer tr.CloseIdleConnections()
	}
	loops := make([]Loop, o.Loops)
	var wg sync.WaitGroup
	for i := range loops {
		wg.Go(func() {
			var c conv
			if transport == WS {
				c = &wsConv{o: &o}
			} else {
				c = &httpConv{o: &o}
			}
			loops[i] = runLoop(ctx, &o, i, c)
		})
	}
	wg.Wait()
	return loops, ctx.Err()
}

// conv is one loop's conversation over a transport.
type conv interface {
	// turn sends the turn: the task (first turn) or the output of the
	// last call, and returns the call the model made.
	turn(ctx context.Context, k int, input string, lastCall call) (call, Turn, error)
	close()
}

// call is one function call.
type call struct{ id, name, args string }

// runLoop runs loop i.
func runLoop(ctx context.Context, o *Options, i int, c conv) Loop {
	defer c.close()
	var l Loop
	start := time.Now()
	var last call
	for k := range o.Turns {
		input := task(o, i)
		if k > 0 {
			input = toolOutput(o, i, k)
		}
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if o.TurnTimeout > 0 {
			tctx, cancel = context.WithTimeout(ctx, o.TurnTimeout)
		}
		cl, t, err := c.turn(tctx, k, input, last)
		cancel()
		if err != nil {
			l.Err = fmt.Sprintf("turn %d: %v", k+1, err)
			break
		}
		t.TTFTMs, t.LatencyMs = ms(t.TTFT), ms(t.Latency)
		l.Turns = append(l.Turns, t)
		last = cl
	}
	l.E2E = time.Since(start)
	l.E2EMs = ms(l.E2E)
	return l
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// toolName and toolParams are the one function every turn calls: its
// arguments are enums, so that a call's length is bounded whatever the
// weights.
const (
	toolName   = "fs"
	toolParams = `{"type":"object","properties":{"op":{"enum":["read","list","grep","stat"]},"path":{"enum":["src/main.go","src/util.go","README.md","go.mod"]}},"required":["op","path"],"additionalProperties":false}`
)

var words = strings.Fields(`the of and to in is that for it as with was on be by this are from at or an
have not which but they all were when there can more one their has been if will would about into out
than them time only its other some may could these two first any then also over file line code value
list read tree path test build error check result next step data table index block cache token`)

// text returns n bytes of lowercase words drawn with r.
func text(r *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()[:n]
}

func rng(o *Options, a, b uint64) *rand.Rand {
	h := uint64(14695981039346656037)
	for _, c := range []byte(o.Tag) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return rand.New(rand.NewPCG(o.Seed^h, a<<32|b))
}

// instructions are the run's system prompt, shared by its loops.
func instructions(o *Options) string {
	head := fmt.Sprintf("[%s] You are a coding agent. Call the fs tool once per turn. ", o.Tag)
	return head + text(rng(o, 1<<31, 0), max(0, o.InstructionsBytes-len(head)))
}

// task is loop i's first user message.
func task(o *Options, i int) string {
	return fmt.Sprintf("Task %d: ", i) + text(rng(o, uint64(i), 0), 64)
}

// toolOutput is the output of loop i's call in turn k-1.
func toolOutput(o *Options, i, k int) string {
	return text(rng(o, uint64(i), uint64(k)), o.ToolOutputBytes)
}

// budget is the part of the pdserve object a turn reports.
type budget struct {
	TTFTMs          float64 `json:"ttft_ms"`
	PromptTokens    int     `json:"prompt_tokens"`
	OutputTokens    int     `json:"output_tokens"`
	PrefixHitTokens int     `json:"prefix_hit_tokens"`
	DecodeWorker    string  `json:"decode_worker"`
	DecodeHit       int     `json:"decode_prefix_hit_tokens"`
	Mode            string  `json:"mode"`
	QueueMs         float64 `json:"queue_ms"`
	PrefillMs       float64 `json:"prefill_ms"`
}

func (b *budget) fill(t *Turn) {
	t.ServerTTFTMs, t.PromptTokens, t.OutputTokens, t.PrefixHitTokens, t.Worker = b.TTFTMs, b.PromptTokens, b.OutputTokens, b.PrefixHitTokens, b.DecodeWorker
	t.Mode, t.QueueMs, t.PrefillMs, t.DecodePrefixHitTokens = b.Mode, b.QueueMs, b.PrefillMs, b.DecodeHit
}

// wsConv is a loop over the Responses API's WebSocket mode.
type wsConv struct {
	o    *Options
	conn *websocket.Conn
	prev string // the last response's id
}

func (c *wsConv) close() {
	if c.conn != nil {
		_ = c.conn.Close(websocket.StatusNormalClosure, "")
	}
}

func (c *wsConv) dial(ctx context.Context) error {
	h := http.Header{}
	if c.o.APIKey != "" {
		h.Set("Authorization", "Bearer "+c.o.APIKey)
	}
	url := "ws" + strings.TrimPrefix(c.o.BaseURL, "http") + "/v1/responses"
	conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h, HTTPClient: c.o.HTTP})
	if err != nil {
		if resp != nil {
			return fmt.Errorf("websocket upgrade: %s: %w", resp.Status, err)
		}
		return fmt.Errorf("websocket upgrade: %w", err)
	}
	conn.SetReadLimit(64 << 20)
	c.conn = conn
	return nil
}

func (c *wsConv) turn(ctx context.Context, k int, input string, last call) (call, Turn, error) {
	if c.conn == nil {
		if err := c.dial(ctx); err != nil {
			return call{}, Turn{}, err
		}
	}
	ev := map[string]any{
		"type": "response.create", "instructions": instructions(c.o),
		"tools":       []any{map[string]any{"type": "function", "name": toolName, "parameters": json.RawMessage(toolParams)}},
		"tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": c.o.MaxOutputTokens,
		"temperature": c.o.Temperature, "store": false,
	}
	if c.o.Model != "" {
		ev["model"] = c.o.Model
	}
	if k == 0 {
		ev["input"] = []any{map[string]any{"role": "user", "content": input}}
	} else {
		ev["previous_response_id"] = c.prev
		ev["input"] = []any{map[string]any{"type": "function_call_output", "call_id": last.id, "output": input}}
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return call{}, Turn{}, err
	}
	t := Turn{RequestBytes: len(data)}
	start := time.Now()
	if err := c.conn.Write(ctx, websocket.MessageText, data); err != nil {
		return call{}, t, fmt.Errorf("write: %w", err)
	}
	for {
		_, msg, err := c.conn.Read(ctx)
		if err != nil {
			return call{}, t, fmt.Errorf("read: %w", err)
		}
		var e struct {
			Type     string          `json:"type"`
			Response json.RawMessage `json:"response"`
			Error    json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return call{}, t, fmt.Errorf("bad event: %w", err)
		}
		if t.TTFT == 0 && (e.Type == "response.output_item.added" || strings.HasSuffix(e.Type, ".delta")) {
			t.TTFT = time.Since(start)
		}
		switch e.Type {
		case "error":
			return call{}, t, fmt.Errorf("error event: %s", e.Error)
		case "response.failed", "response.incomplete":
			return call{}, t, fmt.Errorf("%s: %s", e.Type, trunc(e.Response))
		case "response.completed":
			t.Latency = time.Since(start)
			var r struct {
				ID     string `json:"id"`
				Output []struct {
					Type      string `json:"type"`
					CallID    string `json:"call_id"`
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"output"`
				PDServe budget `json:"pdserve"`
			}
			if err := json.Unmarshal(e.Response, &r); err != nil {
				return call{}, t, fmt.Errorf("response.completed: %w", err)
			}
			r.PDServe.fill(&t)
			c.prev = r.ID
			var calls []call
			for _, it := range r.Output {
				if it.Type == "function_call" {
					calls = append(calls, call{id: it.CallID, name: it.Name, args: it.Arguments})
				}
			}
			if len(calls) != 1 {
				return call{}, t, fmt.Errorf("%d function calls, want 1: %s", len(calls), trunc(e.Response))
			}
			return calls[0], t, nil
		}
	}
}

// httpConv is a loop over chat completions, resending the conversation.
type httpConv struct {
	o    *Options
	msgs []any
}

func (c *httpConv) close() {}

func (c *httpConv) turn(ctx context.Context, k int, input string, last call) (call, Turn, error) {
	if k == 0 {
		c.msgs = []any{map[string]any{"role": "system", "content": instructions(c.o)}, map[string]any{"role": "user", "content": input}}
	} else {
		c.msgs = append(c.msgs,
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": last.id, "type": "function", "function": map[string]any{"name": last.name, "arguments": last.args}}}},
			map[string]any{"role": "tool", "tool_call_id": last.id, "content": input})
	}
	body := map[string]any{
		"messages":    c.msgs,
		"tools":       []any{map[string]any{"type": "function", "function": map[string]any{"name": toolName, "parameters": json.RawMessage(toolParams)}}},
		"tool_choice": "required", "parallel_tool_calls": false, "max_tokens": c.o.MaxOutputTokens,
		"temperature": c.o.Temperature, "stream": true, "stream_options": map[string]any{"include_usage": true},
	}
	if c.o.Model != "" {
		body["model"] = c.o.Model
	}
	data, err := json.Marshal(body)
	if err != nil {
		return call{}, Turn{}, err
	}
	t := Turn{RequestBytes: len(data)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.o.BaseURL+"/v1/chat/completions", bytes.NewReader(data))
	if err != nil {
		return call{}, t, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.o.APIKey)
	}
	start := time.Now()
	resp, err := c.o.HTTP.Do(req)
	if err != nil {
		return call{}, t, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return call{}, t, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	var calls []call
	var finish string
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, rerr := br.ReadBytes('\n')
		if v, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: ")); ok && string(v) != "[DONE]" {
			var ch struct {
				Choices []struct {
					Delta struct {
						Content   *string `json:"content"`
						Reasoning *string `json:"reasoning_content"`
						ToolCalls []struct {
							Index    int    `json:"index"`
							ID       string `json:"id"`
							Function struct {
								Name      string `json:"name"`
								Arguments string `json:"arguments"`
							} `json:"function"`
						} `json:"tool_calls"`
					} `json:"delta"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
				Error   json.RawMessage `json:"error"`
				PDServe *budget         `json:"pdserve"`
			}
			if err := json.Unmarshal(v, &ch); err != nil {
				return call{}, t, fmt.Errorf("bad chunk: %w", err)
			}
			if len(ch.Error) > 0 && string(ch.Error) != "null" {
				return call{}, t, fmt.Errorf("error chunk: %s", ch.Error)
			}
			for _, chc := range ch.Choices {
				d := chc.Delta
				if t.TTFT == 0 && ((d.Content != nil && *d.Content != "") || (d.Reasoning != nil && *d.Reasoning != "") || len(d.ToolCalls) > 0) {
					t.TTFT = time.Since(start)
				}
				for _, tc := range d.ToolCalls {
					for len(calls) <= tc.Index {
						calls = append(calls, call{})
					}
					cl := &calls[tc.Index]
					cl.id += tc.ID
					cl.name += tc.Function.Name
					cl.args += tc.Function.Arguments
				}
				if chc.FinishReason != nil {
					finish = *chc.FinishReason
				}
			}
			if ch.PDServe != nil {
				ch.PDServe.fill(&t)
			}
		}
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				return call{}, t, fmt.Errorf("stream: %w", rerr)
			}
			break
		}
	}
	t.Latency = time.Since(start)
	if finish != "tool_calls" || len(calls) != 1 || calls[0].id == "" {
		return call{}, t, fmt.Errorf("finish_reason %q with %d tool calls, want one call", finish, len(calls))
	}
	return calls[0], t, nil
}

func trunc(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// TurnStats are one turn index's figures over the loops that reached it.
type TurnStats struct {
	Turn   int `json:"turn"`
	Loops  int `json:"loops"`
	TTFTMs struct {
		P50  float64 `json:"p50"`
		Mean float64 `json:"mean"`
	} `json:"ttft_ms"`
	ServerTTFTMsP50    float64 `json:"server_ttft_ms_p50"`
	LatencyMsP50       float64 `json:"latency_ms_p50"`
	PromptTokensP50    float64 `json:"prompt_tokens_p50"`
	PrefixHitTokensP50 float64 `json:"prefix_hit_tokens_p50"`
	// DecodeHitTokensP50: the decode worker's hit (disaggregated).
	DecodeHitTokensP50 float64 `json:"decode_prefix_hit_tokens_p50"`
	RequestBytesP50    float64 `json:"request_bytes_p50"`
	// SameWorker counts the loops whose turn ran on the worker of their
	// turn before (turn 1: 0).
	SameWorker int `json:"same_worker"`
}

// Summary is a run's figures.
type Summary struct {
	Loops    int         `json:"loops"`
	Failed   int         `json:"failed"`
	Errors   []string    `json:"errors,omitempty"`
	PerTurn  []TurnStats `json:"per_turn"`
	E2EMsP50 float64     `json:"e2e_ms_p50"`
	// E2EMsMean is over the loops that ran every turn.
	E2EMsMean float64 `json:"e2e_ms_mean"`
}

// Summarize returns the figures of loops of turns turns.
func Summarize(loops []Loop, turns int) Summary {
	s := Summary{Loops: len(loops)}
	var e2e []float64
	for _, l := range loops {
		if l.Err != "" {
			s.Failed++
			if len(s.Errors) < 5 {
				s.Errors = append(s.Errors, l.Err)
			}
			continue
		}
		e2e = append(e2e, l.E2EMs)
	}
	s.E2EMsP50, s.E2EMsMean = median(e2e), mean(e2e)
	for k := range turns {
		ts := TurnStats{Turn: k + 1}
		var ttft, sttft, lat, prompt, hit, dhit, rb []float64
		for _, l := range loops {
			if k >= len(l.Turns) {
				continue
			}
			t := l.Turns[k]
			ts.Loops++
			ttft, sttft, lat = append(ttft, t.TTFTMs), append(sttft, t.ServerTTFTMs), append(lat, t.LatencyMs)
			prompt, hit, rb = append(prompt, float64(t.PromptTokens)), append(hit, float64(t.PrefixHitTokens)), append(rb, float64(t.RequestBytes))
			dhit = append(dhit, float64(t.DecodePrefixHitTokens))
			if k > 0 && t.Worker != "" && t.Worker == l.Turns[k-1].Worker {
				ts.SameWorker++
			}
		}
		ts.TTFTMs.P50, ts.TTFTMs.Mean = median(ttft), mean(ttft)
		ts.ServerTTFTMsP50, ts.LatencyMsP50 = median(sttft), median(lat)
		ts.PromptTokensP50, ts.PrefixHitTokensP50, ts.RequestBytesP50 = median(prompt), median(hit), median(rb)
		ts.DecodeHitTokensP50 = median(dhit)
		s.PerTurn = append(s.PerTurn, ts)
	}
	return s
}

// median is the 50th percentile, interpolated (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
