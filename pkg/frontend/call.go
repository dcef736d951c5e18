package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/pdserve/pdserve/pkg/budget"
	"github.com/pdserve/pdserve/pkg/chattmpl"
	"github.com/pdserve/pdserve/pkg/respcache"
	"github.com/pdserve/pdserve/pkg/sampling"
	"github.com/pdserve/pdserve/pkg/tracing"
)

// call is one completion request in flight: one Backend.Complete per
// prompt (a batched /v1/completions request has several), run
// concurrently, each with n choices, all written into the one response.
type call struct {
	s       *Server
	plan    *plan
	id      string // the response id
	created int64
	// client is the request's context: done when the client went away.
	client context.Context
	// ctx, a child of client, ends every prompt's Complete; cancel ends
	// it when a prompt fails.
	ctx    context.Context
	cancel context.CancelFunc
	// elsewhere, when not nil, asks another region to serve the request
	// and reports whether one did (its answer written): tried when the
	// request fails here as unavailable (its workers died or left under
	// it) before anything was written to the client.
	elsewhere func() bool

	// mu serializes the prompts' emits: it guards everything below and
	// the response writer.
	mu      sync.Mutex
	sse     *sseWriter
	prompts []*promptRun
	// writeErr is set when writing to the client failed: it went away.
	writeErr error
}

// promptRun is one prompt's Complete.
type promptRun struct {
	req *Request
	// echo is the text of the prompt to prepend to each choice (echo), ""
	// when none.
	echo string
	// promptLP holds the logprobs of prompt tokens 1.. (echo with
	// logprobs), from the Backend's Prompt output.
	promptLP []*sampling.TokenLogprob
	choices  []*choiceState
	finishes []string
	err      error
	// key and cacheable: pr's response cache key, when it may be cached;
	// rec is the output recorded on a miss (respcache.go).
	key       respcache.Key
	cacheable bool
	rec       *cachedPrompt
	// span is the prompt's request span (pkg/tracing), started before
	// its Complete, ended with its log line.
	span trace.Span
}

// choiceState is one choice's output so far. Guarded by call.mu.
type choiceState struct {
	index int // in the response: prompt index × n + choice index
	text  *textStream
	out   strings.Builder // whole response: the text so far
	// ids are the output ids not yet sent (stream) or all of them (whole
	// response), with return_token_ids.
	ids     []int32
	lp      *logprobBuf // nil without logprobs
	offsets runeCounter
	// begun: the echo (text, prompt logprobs) was added; started: a
	// stream chunk of this choice was sent (the chat role goes first).
	begun, started bool
	stopped        bool // a stop string matched: finish "stop"
	// parse splits a chat reply into reasoning, answer and tool calls
	// (nil on /v1/completions); reasoning is the whole response's
	// reasoning so far, calls the tool calls parsed.
	parse     *chattmpl.Parser
	reasoning strings.Builder
	calls     []toolCall
	// callEnded: parallel_tool_calls false and the first call came;
	// nothing after it is output.
	callEnded bool
}

func newCall(s *Server, pl *plan, id string, created int64, w http.ResponseWriter) *call {
	c := &call{s: s, plan: pl, id: id, created: created, sse: &sseWriter{w: w, rc: http.NewResponseController(w)}}
	p := pl.p
	for i, req := range pl.reqs {
		pr := &promptRun{req: req, echo: pl.echo[i]}
		if s.cache != nil {
			pr.key, pr.cacheable = cacheKey(p, req, s.cachePartition(pl.client))
		}
		for j := range p.n {
			ch := &choiceState{index: i*p.n + j, text: &textStream{decode: s.o.Tokenizer.DecodeToken, stops: p.stops}}
			if p.logprobs >= 0 {
				ch.lp = &logprobBuf{chat: p.chat, decode: s.o.Tokenizer.DecodeToken}
			}
			if p.chat {
				ch.parse = chattmpl.NewParser(pl.format, p.toolChoice != choiceNone, pl.inThink)
			}
			pr.choices = append(pr.choices, ch)
		}
		c.prompts = append(c.prompts, pr)
	}
	return c
}

// run completes every prompt and writes the response. Every goroutine it
// starts has ended when it returns.
func (c *call) run(ctx context.Context, w http.ResponseWriter) {
	c.client = ctx
	c.ctx, c.cancel = context.WithCancel(ctx)
	defer c.cancel()
	complete := func(pr *promptRun) {
		ctx, span := tracing.StartRequest(c.ctx, c.s.o.TracerProvider, pr.req.Trace)
		pr.span = span
		pr.finishes, pr.err = c.completeCached(ctx, pr)
		if errors.Is(pr.err, ErrStopped) {
			pr.err = nil // a Backend that ended the request on a stop string
		}
		if pr.err != nil {
			c.cancel() // the request fails: stop the other prompts
		}
	}
	// The last (usually the only) prompt runs on the handler's goroutine,
	// the others on goroutines of their own.
	var wg sync.WaitGroup
	last := len(c.prompts) - 1
	for _, pr := range c.prompts[:last] {
		wg.Go(func() { complete(pr) })
	}
	complete(c.prompts[last])
	wg.Wait()
	// Every Complete returned: the output is counted. Give back the
	// tokens not used before the client sees the end of the response.
	if pl := c.plan; pl.tokensTaken > 0 {
		pl.client.key.SettleTokens(c.s.o.Now(), pl.tokensTaken, pl.used())
	}
	// A forwarded request's usage settles the origin's charge.
	c.plan.client.fwd.used(c.plan.used())

	var failed *promptRun
	for _, pr := range c.prompts {
		if pr.err != nil && (failed == nil || !isCancel(pr.err) && isCancel(failed.err)) {
			failed = pr // the first error that is not a cancellation, if any
		}
	}
	if failed != nil {
		c.fail(w, failed)
		return
	}
	status := budget.StatusOK
	var aerr *apiError
	if err := c.complete(w); err != nil {
		status, aerr = budget.StatusCancelled, cancelled(err)
	} else {
		c.storeCached()
	}
	for i, pr := range c.prompts {
		tr := pr.req.Trace
		tr.Status, tr.FinishReason = status, c.finish(pr, 0)
		c.s.finish(tr, aerr, c.logFields(i)...)
		tracing.EndRequest(pr.span, tr, c.s.o.Now())
	}
}

func isCancel(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// logFields are the extra fields of prompt i's log line.
func (c *call) logFields(i int) []zap.Field {
	f := c.plan.client.fields()
	if len(c.prompts) > 1 {
		f = append(f, zap.String("batch_request_id", c.id), zap.Int("batch_index", i), zap.Int("batch_prompts", len(c.prompts)))
	}
	if n := c.plan.p.n; n > 1 {
		pr := c.prompts[i]
		reasons := make([]string, n)
		for j := range reasons {
			reasons[j] = c.finish(pr, j)
		}
		f = append(f, zap.Int("n", n), zap.Strings("finish_reasons", reasons))
	}
	return f
}

// finish returns the finish reason of choice j of pr: "tool_calls"
// when it ended (not cut by max_tokens) with tool calls, as OpenAI's.
func (c *call) finish(pr *promptRun, j int) string {
	ch := pr.choices[j]
	reason := "stop"
	if !ch.stopped && j < len(pr.finishes) && pr.finishes[j] != "" {
		reason = pr.finishes[j]
	}
	if reason == "stop" && len(ch.calls) > 0 {
		return "tool_calls"
	}
	return reason
}

// end returns how choice j of pr ended, for parseText: cut when by
// max_tokens.
func (c *call) end(pr *promptRun, j int) int {
	if c.finish(pr, j) == "length" {
		return cut
	}
	return ended
}

// parsed is a piece of a chat reply: answer text, reasoning, tool calls.
type parsed struct {
	content, reasoning string
	calls              []toolCall
}

// visible reports whether d holds output that is not reasoning (TTFO).
func (d parsed) visible() bool { return d.content != "" || len(d.calls) > 0 }

// Ends of a chat reply, for parseText.
const (
	more = iota // more text may come
	ended
	cut // ended by max_tokens: a call cut short is a call, as far as it goes
)

// parseText runs text of ch through its chat parser (end: whether the
// reply ended, and how; held text is flushed) and records the calls; on
// /v1/completions it is all content. With parallel_tool_calls false a
// choice ends at its first call (stopped is then true).
func (c *call) parseText(ch *choiceState, text string, end int) (d parsed, stopped bool) {
	switch {
	case ch.callEnded:
		return parsed{}, false
	case ch.parse == nil:
		return parsed{content: text}, false
	}
	pd := ch.parse.Push(text)
	if end != more {
		flush := ch.parse.Flush
		if end == cut {
			flush = ch.parse.Cut
		}
		f := flush()
		pd.Content += f.Content
		pd.Reasoning += f.Reasoning
		pd.Calls = append(pd.Calls, f.Calls...)
		if f.Cut != nil {
			pd.Calls = append(pd.Calls, *f.Cut)
		}
	}
	d = parsed{content: pd.Content, reasoning: pd.Reasoning}
	for _, tc := range pd.Calls {
		if !c.plan.p.parallel && len(ch.calls) > 0 {
			break // one call only; the choice has ended on it
		}
		out := toolCall{Index: len(ch.calls), ID: "call_" + newID(), Type: "function", Function: toolFunction{Name: tc.Name, Arguments: tc.Arguments}}
		ch.calls = append(ch.calls, out)
		d.calls = append(d.calls, out)
	}
	ch.reasoning.WriteString(d.reasoning)
	if !c.plan.p.parallel && len(ch.calls) > 0 {
		// Cut by max_tokens, the choice keeps finish "length".
		ch.stopped, ch.callEnded = end != cut, true
		return d, end == more
	}
	return d, false
}

// emitter returns the EmitFunc of pr.
func (c *call) emitter(pr *promptRun) EmitFunc {
	return func(o Output) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.writeErr != nil {
			return c.writeErr
		}
		if err := c.ctx.Err(); err != nil {
			return err // the request failed or the client went away
		}
		if o.Prompt {
			if pr.req.PromptLogprobs >= 0 {
				pr.promptLP = make([]*sampling.TokenLogprob, len(o.Logprobs))
				for i := range o.Logprobs {
					pr.promptLP[i] = &o.Logprobs[i]
				}
			}
			return nil
		}
		if o.Index < 0 || o.Index >= len(pr.choices) {
			return fmt.Errorf("frontend: output for choice %d of a request with %d", o.Index, len(pr.choices))
		}
		ch := pr.choices[o.Index]
		if ch.stopped {
			return ErrStopped
		}
		if len(o.Tokens) == 0 {
			return nil
		}
		text := c.begin(pr, ch)
		n := 0
		stopped := false
		for i, tok := range o.Tokens {
			t, stopped := ch.text.push(o.Tokens[i : i+1])
			text += t
			n++
			if c.plan.p.returnIDs {
				ch.ids = append(ch.ids, tok)
			}
			if ch.lp != nil {
				var lp *sampling.TokenLogprob
				if i < len(o.Logprobs) {
					lp = &o.Logprobs[i]
				}
				ch.lp.add(tok, lp, ch.offsets.next(c.s.o.Tokenizer.DecodeToken(tok)))
			}
			if stopped {
				ch.stopped = true
				break
			}
		}
		stopped = ch.stopped
		d, callStop := c.parseText(ch, text, more)
		stopped = stopped || callStop
		var err error
		if c.plan.p.stream {
			err = c.sendParsed(ch, d, nil, nil)
		} else {
			ch.out.WriteString(d.content)
		}
		if err != nil {
			c.writeErr = err
			c.cancel()
			return err
		}
		// Record the delivery once the client has it (or, for a whole
		// response, once it is final).
		now := c.s.o.Now()
		pr.req.Trace.Tokens(now, n)
		if d.visible() {
			pr.req.Trace.Output(now)
		}
		if stopped {
			return ErrStopped
		}
		return nil
	}
}

// begin returns the echo of pr to prepend to ch's text, once, and adds
// the prompt's logprob entries; "" when done before or without echo.
func (c *call) begin(pr *promptRun, ch *choiceState) string {
	if ch.begun {
		return ""
	}
	ch.begun = true
	if pr.echo == "" {
		return ""
	}
	// With echo and logprobs, prepare always asks for the prompt's
	// logprobs (PromptLogprobs = logprobs ≥ 0).
	if ch.lp != nil {
		for i, tok := range pr.req.Prompt {
			var lp *sampling.TokenLogprob // null: the first token, or none sent
			if i > 0 && i-1 < len(pr.promptLP) {
				lp = pr.promptLP[i-1]
			}
			ch.lp.add(tok, lp, ch.offsets.next(c.s.o.Tokenizer.DecodeToken(tok)))
		}
	}
	return pr.echo
}

// sendParsed sends d as stream chunks of ch: one of its content and
// reasoning (also when ch has not started, or carries logprobs or
// finish), then, per tool call, a chunk of its index, id, type, name and
// empty arguments and one of its arguments, as OpenAI streams them;
// finish and pd go on the last.
func (c *call) sendParsed(ch *choiceState, d parsed, finish *string, pd *pdserveSummary) error {
	if d.content != "" || d.reasoning != "" || !ch.started || ch.lp != nil || finish != nil && len(d.calls) == 0 {
		f, s := finish, pd
		if len(d.calls) > 0 {
			f, s = nil, nil
		}
		if err := c.sse.event(c.chunk(ch, d.content, d.reasoning, nil, f, s)); err != nil {
			return err
		}
	}
	for i, tc := range d.calls {
		head := tc
		head.Function.Arguments = ""
		if err := c.sse.event(c.chunk(ch, "", "", []toolCall{head}, nil, nil)); err != nil {
			return err
		}
		var f *string
		var s *pdserveSummary
		if i == len(d.calls)-1 {
			f, s = finish, pd
		}
		args := toolCall{Index: tc.Index, Function: toolFunction{Arguments: tc.Function.Arguments}}
		if err := c.sse.event(c.chunk(ch, "", "", []toolCall{args}, f, s)); err != nil {
			return err
		}
	}
	return nil
}

// chunk returns a stream chunk of ch carrying text (chat: content,
// reasoning and tool call deltas), its pending ids and logprobs, and
// finish when not nil. The first chat chunk of a choice carries the
// assistant role.
func (c *call) chunk(ch *choiceState, text, reasoning string, calls []toolCall, finish *string, pd *pdserveSummary) completion {
	out := completion{ID: c.id, Created: c.created, Model: c.plan.model, PDServe: pd}
	cc := choice{Index: ch.index, FinishReason: finish, TokenIDs: ch.ids}
	ch.ids = nil
	if ch.lp != nil {
		cc.Logprobs = ch.lp.take()
	}
	if c.plan.p.chat {
		out.Object = "chat.completion.chunk"
		d := &delta{ToolCalls: calls}
		if !ch.started {
			d.Role = "assistant"
		}
		if text != "" || d.Role != "" && reasoning == "" && len(calls) == 0 {
			d.Content = &text
		}
		if reasoning != "" {
			d.Reasoning = &reasoning
		}
		cc.Delta = d
	} else {
		out.Object = "text_completion"
		cc.Text = &text
	}
	ch.started = true
	out.Choices = []choice{cc}
	return out
}

// usage sums the prompts' tokens; completion tokens count every choice.
func (c *call) usage() *usage {
	u := &usage{}
	for _, pr := range c.prompts {
		u.PromptTokens += pr.req.Trace.PromptTokens
		u.CompletionTokens += pr.req.Trace.OutputTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// summary returns the `pdserve` object.
func (c *call) summary() *pdserveSummary {
	s := &pdserveSummary{Summary: c.prompts[0].req.Trace.Summary()}
	if len(c.prompts) > 1 {
		for _, pr := range c.prompts {
			s.Prompts = append(s.Prompts, promptSummary{RequestID: pr.req.ID, Summary: pr.req.Trace.Summary()})
		}
	}
	return s
}

// complete writes the end of a successful response: the whole response,
// or each choice's last chunk (held-back text, finish reason), the usage
// chunk and [DONE]. It returns the error writing to the client.
func (c *call) complete(w http.ResponseWriter) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.s.o.Now()
	for _, pr := range c.prompts {
		pr.req.Trace.Ended = now // before the summaries the end carries
	}
	p := c.plan.p
	if !p.stream {
		out := completion{ID: c.id, Object: "text_completion", Created: c.created, Model: c.plan.model, Usage: c.usage(), PDServe: c.summary()}
		if p.chat {
			out.Object = "chat.completion"
		}
		for _, pr := range c.prompts {
			for j, ch := range pr.choices {
				text := c.begin(pr, ch)
				d, _ := c.parseText(ch, text+ch.text.flush(), c.end(pr, j))
				ch.out.WriteString(d.content)
				if d.visible() {
					pr.req.Trace.Output(c.s.o.Now())
				}
				finish := c.finish(pr, j)
				cc := choice{Index: ch.index, FinishReason: &finish, TokenIDs: ch.ids}
				if ch.lp != nil {
					cc.Logprobs = ch.lp.take()
				}
				if p.chat {
					content := ch.out.String()
					m := &message{Role: "assistant", Content: &content}
					for _, tc := range ch.calls {
						m.ToolCalls = append(m.ToolCalls, messageCall{ID: tc.ID, Type: tc.Type, Function: namedFunction(tc.Function)})
					}
					if len(ch.calls) > 0 && strings.TrimSpace(content) == "" {
						m.Content = nil // as OpenAI sends a reply of calls only
					}
					if r := ch.reasoning.String(); r != "" {
						m.Reasoning = &r
						if content == "" {
							m.Content = nil // reasoning only, as vLLM sends it
						}
					}
					cc.Message = m
				} else {
					s := ch.out.String()
					cc.Text = &s
				}
				out.Choices = append(out.Choices, cc)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(out)
	}
	if c.writeErr != nil {
		return c.writeErr
	}
	for i, pr := range c.prompts {
		for j, ch := range pr.choices {
			d, _ := c.parseText(ch, c.begin(pr, ch)+ch.text.flush(), c.end(pr, j))
			if d.visible() {
				pr.req.Trace.Output(c.s.o.Now())
			}
			finish := c.finish(pr, j)
			var pd *pdserveSummary
			if !p.usage && i == len(c.prompts)-1 && j == len(pr.choices)-1 {
				pd = c.summary()
			}
			if err := c.sendParsed(ch, d, &finish, pd); err != nil {
				return err
			}
		}
	}
	if p.usage {
		object := "text_completion"
		if p.chat {
			object = "chat.completion.chunk"
		}
		u := completion{ID: c.id, Object: object, Created: c.created, Model: c.plan.model, Choices: []choice{}, Usage: c.usage(), PDServe: c.summary()}
		if err := c.sse.event(u); err != nil {
			return err
		}
	}
	return c.sse.done()
}

// fail reports the failure of prompt failed: nothing when the client went
// away, else as the response when nothing was sent yet, else as an error
// event ending the stream. A context error of a Backend whose client is
// still there is an internal error. Every
// prompt's log line gets the request's status and error; the cause goes
// on the line of the prompt that failed.
func (c *call) fail(w http.ResponseWriter, failed *promptRun) {
	c.mu.Lock()
	defer c.mu.Unlock()
	aerr := backendError(failed.err, failed.req.ID)
	var status string
	switch {
	case c.writeErr != nil || c.client.Err() != nil:
		status, aerr = budget.StatusCancelled, cancelled(failed.err)
	case c.sse.started:
		status = budget.StatusError // failed after output began
	default:
		status = aerr.traceStatus()
	}
	if status == budget.StatusUnavailable && c.elsewhere != nil && len(c.prompts) == 1 {
		// Nothing reached the client: another region may serve it, as a
		// request this region could not take at all goes there. Every
		// emit has returned, so w is this goroutine's alone.
		c.s.o.Logger.Warn("request failed here before any output; asking another region", append(c.plan.client.fields(),
			zap.String("request_id", failed.req.ID), zap.NamedError("cause", failed.err))...)
		if c.elsewhere() {
			tracing.EndRequest(failed.span, failed.req.Trace, c.s.o.Now())
			return
		}
	}
	for i, pr := range c.prompts {
		pr.req.Trace.Status = status
		line := aerr
		if pr != failed {
			cp := *aerr
			cp.cause = nil
			line = &cp
		}
		c.s.finish(pr.req.Trace, line, c.logFields(i)...)
		tracing.EndRequest(pr.span, pr.req.Trace, c.s.o.Now())
	}
	switch {
	case status == budget.StatusCancelled:
		return // nobody to tell
	case !c.sse.started:
		writeError(w, aerr, c.s.o.RetryAfter)
	default:
		_ = c.sse.event(struct {
			Error *apiError `json:"error"`
		}{aerr})
		_ = c.sse.done()
	}
}
