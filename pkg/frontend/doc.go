// Package frontend is pdserve's OpenAI-compatible HTTP surface:
// POST /v1/completions and /v1/chat/completions (Server-Sent Events when
// "stream": true, a JSON body otherwise), GET /v1/models, /healthz
// (liveness), /readyz (readiness) and /metrics (Prometheus).
//
// The frontend admits a request, reads and validates its body, tokenizes
// its prompts, enforces the prompt-token budget of its surface, the
// max_tokens cap and the model's context length (a 400 with an
// OpenAI-shaped error otherwise), then hands each prompt to a Backend,
// which streams output tokens back through an EmitFunc. The frontend
// turns tokens into text (holding back bytes of an incomplete UTF-8
// sequence and any text that may be the start of a stop string), writes
// each SSE event and flushes it at once, and ends the stream with
// `data: [DONE]`. The last chunk of a stream (the usage chunk when
// stream_options.include_usage is set) and a non-streaming response carry
// a `pdserve` object with the request's latency budget (see pkg/budget).
// Its client_rtt_ms is the client's network round trip, which a server
// whose ConnContext is ConnContext reads from the kernel (Linux
// TCP_INFO) on the request's TCP connection, TLS or not; the client sees
// about ttft_ms + client_rtt_ms, and a TTFT budget covers both.
// Each request ends in one zap log line and one observation in
// pkg/metrics (one per prompt for a batched request).
//
// # Parameters
//
// Every parameter OpenAI documents for the route is either implemented
// or refused with a 400 whose code is "unsupported_value" and whose param
// names it; none is ignored without saying so here. Implemented: model,
// prompt (completions) or messages (chat), max_tokens and chat's
// max_completion_tokens (equal when both are given), temperature [0, 2]
// (1 when absent, as OpenAI defines it; 0 is greedy), top_p (0, 1], n
// 1..128, best_of (absent or equal to n), seed, stop (up
// to 4 strings, each choice stopped on its own), stream, stream_options
// {include_usage}, presence_penalty and frequency_penalty [-2, 2]
// (Request.Sampling.Penalties, nil when both are 0), logprobs, chat's
// top_logprobs, echo on /v1/completions, and response_format on both
// routes: {"type":"json_object"} and {"type":"json_schema","json_schema":
// {name, schema, strict}} become a GBNF grammar (Request.Sampling.Grammar,
// pkg/grammar) that the workers decode under, so the output is a prefix of
// a valid document; one cut by max_tokens ends with finish_reason
// "length" and truncated JSON, as OpenAI's does. Schema keywords pkg/grammar
// does not support are refused with a 400 unsupported_value naming them;
// a schema (or tools' grammar) over one of pkg/grammar's limits with a
// 400 schema_too_large naming the limit, without Retry-After. A grammar
// that allows no token ends the request with an error (a 500, or an
// error event on a stream), never with the token it refused.
//
// On chat, tools ([{"type":"function","function":{name, description,
// parameters, strict}}]), tool_choice ("none", "auto" (the default with
// tools), "required", {"type":"function","function":{"name"}}) and
// parallel_tool_calls (default true) are implemented: see "Tool calls".
//
// Accepted without effect on the output: user, safety_identifier and
// metadata (not stored), prompt_cache_key (the router routes by prompt
// prefix already), store false (true is refused: nothing is stored),
// service_tier "auto" or "default" (there is one tier; others are
// refused), and on chat the trivial forms of what pdserve lacks:
// functions empty and function_call "none" or "auto" (deprecated; give
// tools), response_format {"type":"text"}, modalities ["text"],
// logit_bias {}. Refused when given otherwise: functions, function_call,
// logit_bias, modalities, audio, prediction, web_search_options,
// reasoning_effort, verbosity, suffix, and echo on chat.
//
// # Tool calls
//
// Tools are rendered by the model's own chat template (pkg/chattmpl, Jinja
// in Go), and the reply is parsed in the template's tool-call format:
// Hermes/Qwen <tool_call>{"name","arguments"}</tool_call> blocks, or
// Llama 3's JSON {"name","parameters"}. A template that renders no tools
// (and the byte-level and llama.cpp fallbacks) gets them described in
// Hermes' format in the system message; one that renders tools in
// another syntax (gemma 4's) gets a 400 unsupported_value on tools.
// tool_choice "none" leaves the tools out of the prompt and parses
// nothing. A reply's calls become message.tool_calls [{id "call_…", type
// "function", function {name, arguments (a JSON string)}}], content null
// when nothing else was said, finish_reason "tool_calls"; streamed, each
// call is a delta {index, id, type, function {name, arguments ""}} then
// one {index, function {arguments}}, as OpenAI sends them. A call that
// does not parse stays content, except one cut by max_tokens: as
// OpenAI's, it is in tool_calls as far as it goes (its name when written
// whole, else ""; its arguments' text as cut) with finish_reason
// "length" (on the Responses API a function_call item with status
// "incomplete"). tool_choice "required" (any of the
// tools) and a named function decode under a grammar of the call syntax
// around the tools' parameter schemas (pkg/grammar; keywords it does not
// support are a 400 unsupported_value on tools), so even random weights
// produce a valid call; with a JSON response_format (as agent frameworks
// send with an output type) the call's grammar replaces the format's for
// that reply, which has no text. parallel_tool_calls false allows one call: the
// grammar's, or under "auto" the choice ends at its first call.
// Assistant messages' tool_calls and tool messages (tool_call_id) go back
// into the template.
//
// # Reasoning
//
// A chat reply that starts with <think> (or whose prompt the template
// ended inside <think>, as DeepSeek-R1's does) has its reasoning, up to
// </think>, in message.reasoning_content and in the stream deltas'
// reasoning_content, as vLLM and DeepSeek's API send it; content holds
// the rest (null when the reply is all reasoning). The coordinator's
// --chat-template-file (Options.ChatTemplate) replaces the model's
// template, e.g. with a reasoning model's. The budget's ttfo_ms is the time to the first output that is
// not reasoning (AIPerf's TTFO), beside ttft_ms.
//
// A field the route does not know gets a 400 as OpenAI sends it:
// "Unrecognized request argument supplied: X", code "unknown_parameter",
// param X (names match case-sensitively; unknown fields inside
// stream_options likewise, as "stream_options.X"). Fields of a chat
// message other than role and content are ignored, so that a client may
// send a previous reply back as it got it. A parameter of the wrong JSON
// type gets code "invalid_type" and a message in the API's terms
// ("max_tokens must be an integer", "metadata must be an object of
// strings") with param naming it; a body that is not JSON gets
// "invalid_json" with the byte offset of the error.
//
// # Max tokens and the context
//
// A prompt's tokens plus max_tokens must fit in the model's context
// (Model.MaxModelLen), else a 400 with code context_length_exceeded,
// OpenAI's wording and param "prompt" or "messages", before any worker is
// asked; so must every prompt of a batch. Without max_tokens a request
// gets the rest of the context (max_model_len − prompt tokens), lowered
// to the policy's limits.default_max_tokens and limits.max_tokens_cap
// when they are set (both default to 0: no bound beyond the context); a
// prompt that fills the context is a 400. When the model's context length
// is unknown, a request without max_tokens gets the policy's
// default_max_tokens, else UnknownContextMaxTokens (16, OpenAI's default
// on /v1/completions, short enough for any worker), lowered to the cap;
// the workers refuse what does not fit them. max_tokens must be at least
// 1. A max_tokens (or max_completion_tokens) that alone fills the context
// is a 400 context_length_exceeded naming that parameter; with an unknown
// context, prompt + max_tokens must fit MaxSequenceTokens (2³¹−1, what the
// workers' RPCs carry), else a 400 invalid_value naming it. Every check is
// written so that no sum or product of client numbers can overflow, and
// the tokens a request takes from its key's tokens a minute saturate.
//
// # Memory per request
//
// Every count a body controls is bounded before it is decoded: a scan of
// the raw body (no allocation) refuses, at the element that exceeds it, a
// prompt of more token ids than the longest context of the served models
// (400 context_length_exceeded), a batch of more prompts than
// Options.MaxInFlight (2048 without one; 400 invalid_value), more chat
// messages than that context (each renders to a token at least), and any
// other array or object of more than 4096 elements. Token ids are then
// decoded straight into []int32 (4 bytes each, no copy of the raw JSON,
// no value per id). So a request holds its body (at most
// Options.MaxBodyBytes; read into one buffer of its Content-Length) plus
// at most 4 bytes × the longest context × the batch limit of token ids,
// plus its text prompts and messages (no more bytes than the body) and,
// for a text prompt, the tokenizer's ids (4 bytes a token). With a 16 MiB
// limit and a 1024-token context, one 16 MiB body of token ids peaks
// under 50 MiB of heap (the adversarial suite asserts it for four at
// once). Options.MaxInFlightBodyBytes bounds the bodies of all requests
// together.
//
// # Sampling and seeds
//
// A request without "seed" gets a random seed of its own (crypto/rand),
// so that unseeded sampling differs between requests, as OpenAI's does;
// with a seed it is reproducible. Choice i of n samples with seed + i
// (the Backend applies it), so choices differ too.
//
// # Logprobs
//
// Log-probabilities are the model's, of its raw logits (before
// temperature, top-p and penalties); -Inf is sent as -9999.0. On
// /v1/completions "logprobs": N (0..20; OpenAI allows 5, vLLM 20) gives
// each choice OpenAI's {tokens, token_logprobs, top_logprobs,
// text_offset}: per token its text, its logprob, an object of the N most
// probable tokens and itself (up to N+1 entries, most probable first),
// and its offset in characters in the choice's text. A token whose bytes
// are not valid UTF-8 (a byte-level piece of a character) is written
// "bytes:\xNN…", as vLLM. On chat, "logprobs": true with "top_logprobs"
// 0..20 gives {content: [{token, logprob, bytes, top_logprobs: [{token,
// logprob, bytes}]}], refusal: null}, bytes being the token's raw bytes
// and a non-UTF-8 token written \xNN…. Stream chunks carry the logprobs of
// their own tokens.
//
// "echo": true on /v1/completions prepends the prompt to each choice's
// text (its text as given, or the decoded token ids). With logprobs the
// prompt's tokens come first in the lists, the first with a null
// token_logprob and null top_logprobs, as OpenAI and lm-evaluation-harness
// (which reads token_logprobs[ctxlen:-1]) expect; the Backend is asked
// for them with Request.PromptLogprobs.
//
// # Prompts, n and batches
//
// "prompt" is a string, an array of token ids, or an array of either: a
// batch, one prompt each (at most the in-flight limit). Text is tokenized
// with the engine's tokenizer; no BOS token is added. Each prompt is one
// Backend.Complete with N = n (the choices share the prompt's KV), run
// concurrently, their output written into the one response (serialized)
// and every call returned before the response ends. Choice j of prompt i
// has index i×n + j, as vLLM; stream chunks of different choices
// interleave, each with its index; usage sums every prompt and every
// choice. When one prompt fails the others are cancelled and the request
// fails.
//
// A batched request's prompts have ids of their own (the response id,
// "-", the prompt index) on the workers and in the logs: each prompt has
// its own budget trace, log line (with batch_request_id, batch_index and
// batch_prompts) and metrics observation. The `pdserve` object holds the
// first prompt's budget at its top level, as for a single prompt, and
// the budget of every prompt, with its request_id, in "prompts". A
// request with n > 1 logs n and each choice's finish reason
// (finish_reasons); its finish_reason field is choice 0's.
//
// # HTTP
//
// A completion request must have Content-Type application/json (any
// parameters, such as charset) or none at all (then read as JSON, for
// hand-written clients); anything else, notably the form type curl -d
// sends without -H, gets 415 with code "unsupported_media_type".
//
// Admission comes first, before the body is read: at most
// Options.MaxInFlight requests (the policy's queue_limit in the
// coordinator) from admission to the end of their response, a batched
// request holding one per prompt; one more gets 429 (code "overloaded")
// with Retry-After at once, its body unread. So the memory request bodies
// hold stays under MaxInFlight × MaxBodyBytes (a test measures it with
// 1,000 concurrent 16 MiB uploads). With Options.MaxInFlightBodyBytes
// the bodies share a byte budget too: a body takes its Content-Length at
// admission (a body without one, its buffer as it grows) until its
// response ends; one that does not fit gets 429 (code "overloaded") with
// Retry-After, as a full queue, since it is the server's capacity and
// not the request that is at fault. A body over Options.MaxBodyBytes
// (default 16 MiB) gets 413; one that makes no progress for
// Options.BodyIdleTimeout, or is not whole within Options.BodyTimeout of
// its admission (a body trickled a byte at a time), gets 408 and its
// connection is closed, its admission slot given back. The deadlines are
// cleared once the body is read, so a response stream may idle for as
// long as generation takes. The header timeout is the http.Server's (the
// coordinator's --http-read-header-timeout).
//
// With Options.WriteTimeout each write of a response (a stream event, a
// whole response) must complete within it: a client that stops reading
// has its request cancelled (the Backend's calls end, the workers free
// its KV and output), logged at warn ("client stopped reading: request
// cancelled") and counted in pdserve_stream_stalled_cancels_total.
//
// A client that goes away is logged with http_status 499 and error
// "cancelled" (the cause is logged apart), status "cancelled" in the
// metrics, and its Backend calls are cancelled.
//
// # Errors
//
// Errors are JSON {"error":{"message","type","param","code"}}. The
// frontend's own refusals say what is wrong with the request. No internal
// text reaches a client: a Backend error gets a generic message of its
// kind, and the error itself goes to the request log as "cause":
// ErrOverloaded 429 "overloaded" with Retry-After, ErrUnavailable 503
// "unavailable" with Retry-After, ErrInvalid 400 "invalid_request", and
// anything else 500 "internal_error" ("internal error; see the server
// log for request <id>"). No model served yet is a 503 "no_workers". A
// Backend that has something to tell the client returns NewError's
// *Error (kind, code, param, message), which is sent as it is and still
// matches its kind with errors.Is. An error after the stream started is
// sent as a final `data: {"error":...}` event followed by `data: [DONE]`.
//
// # Extensions
//
// "ignore_eos" (vLLM) generates past EOS and every other end-of-generation
// token of the model (engine.EOGTokens) up to max_tokens, as load
// generators ask. "return_token_ids" (vLLM) adds "token_ids" to each
// choice: all output ids on a whole response, the ids delivered since the
// previous chunk on a stream chunk.
//
// # Chat template
//
// Each chat message has a role (system, developer, user, assistant or
// tool; others get a 400) and a content that is a string, null, or an
// array of {"type":"text"} parts, joined into one text. When the
// tokenizer carries the model's Jinja chat template (llama.cpp's: the
// GGUF's tokenizer.chat_template), it renders the messages with
// pkg/chattmpl (bos_token stripped when the tokenizer adds BOS itself); a
// template the Jinja engine cannot compile is logged once and rendered by
// llama.cpp's llama_chat_apply_template instead (engine.ChatTemplater,
// no tools of its own). Either way roles are passed as given, and
// the result is tokenized with Encode as it is: a template that wants a
// BOS or other special tokens renders them, and Encode must read them as
// special tokens. A template that cannot render the messages, or renders
// nothing, gets a 400 (code "chat_template_error" or "empty_prompt", param
// "messages"); the template's own error text is logged with the request,
// never sent. Without a template of the tokenizer's own, messages are
// rendered for the byte-level tokenizer as
//
//	<|role|>\n{content}\n
//
// per message, then "<|assistant|>\n" to open the reply. For example
// [{"role":"user","content":"Hi"}] becomes "<|user|>\nHi\n<|assistant|>\n".
//
// # Models
//
// GET /v1/models lists Options.Models in vLLM's shape:
// {"id","object":"model","created","owned_by","max_model_len"}, where
// max_model_len is the model's longest sequence (prompt + output) in
// tokens, omitted while unknown. A request naming a model not listed gets
// 404 with code "model_not_found", param "model" and OpenAI's wording
// ("The model `X` does not exist or you do not have access to it."); one
// without "model" gets the first.
//
// # Authentication and rate limits
//
// With Options.APIKeys (the coordinator's --api-keys; package apikey)
// every request to /v1/ (completions, chat, models, and unknown /v1/
// paths) must carry one of its keys as "Authorization: Bearer KEY" (the
// scheme in any case) or "x-api-key: KEY" (Anthropic's), checked before anything else of the request, its
// body unread. Without one it gets 401 in OpenAI's shape, type
// "invalid_request_error", code "invalid_api_key", message OpenAI's "You
// didn't provide an API key. …" when the request carries none, else
// "Incorrect API key provided. …" (never echoing what was sent). Each
// refusal is logged at warn ("request refused") with api_key "none" or
// "unknown key", the first 8 hex digits of the SHA-256 of what was sent
// (api_key_sha256), the method, path and remote address; never the key.
// /healthz and /readyz stay open. With Options.MetricsToken, /metrics
// wants its own bearer token (401 with WWW-Authenticate otherwise, logged
// as "metrics request refused"). Without APIKeys nobody is authenticated.
//
// A completion request of a key with limits takes one request from its
// requests-a-minute bucket before admission (so a key over its limit
// holds no slot and its body is not read) and, once its prompts are
// tokenized, its tokens from its tokens-a-minute bucket: every prompt's
// tokens plus n × max_tokens. When it ends it gives back what it did not
// use: it is charged its prompt tokens and the output tokens delivered
// (a request that failed or was cancelled included; a refused request
// still counts as a request, as OpenAI's do). Over a limit it gets 429,
// code "rate_limit_exceeded", type "requests" or "tokens", OpenAI's
// message ("Rate limit reached for API key NAME on requests per min
// (RPM): Limit L, Used U, Requested R. Please try again in 20ms.") and
// Retry-After the wait (whole seconds, rounded up); one that asks for
// more tokens than the limit gets "Request too large …" with no
// Retry-After (it can never succeed as it is; OpenAI sends none either,
// and SDKs would retry it forever). Every response
// of a limited completion request, refusals included, carries OpenAI's
// headers of each limit the key has: x-ratelimit-limit-requests,
// x-ratelimit-remaining-requests, x-ratelimit-reset-requests (the time
// until the bucket is full again, as a Go duration of whole milliseconds:
// "0s", "120ms", "6m0s"), and the same for tokens. /v1/models is
// authenticated but not limited. Request log lines carry the key's name
// as api_key. The buckets' clock is Options.Now.
//
// # Surfaces and budgets
//
// A request's surface is its API key when the policy lists it, else its
// route. With APIKeys the surface is the authenticated key's name (the
// policy's prompt_budgets.api_keys are key names, see
// config.Budgets.NamedBudget); without, the key sent as Authorization:
// Bearer selects a budget but is not checked.
//
// # Response cache
//
// With the policy's response_cache (entries > 0) each prompt of a greedy (temperature 0) or
// seeded request is looked up before its Backend call, keyed by the
// route, the model, the prompt tokens, max_tokens, n, temperature, top_p,
// the seed (not at temperature 0), the penalties, ignore_eos, logprobs,
// prompt logprobs (echo with logprobs) and the stop strings. A miss
// records every Output the client took and the finish reasons; once the
// whole response completed (not on an error, a cancellation or a client
// that went away) it is stored (package respcache: LRU by entries and
// bytes, a TTL). A hit replays the Outputs through the same emit path, so
// its text, stop-string finishes, logprobs, stream chunks and whole body
// are those of the miss (stream, include_usage, echo without logprobs and
// return_token_ids only shape the rendering and may differ). Its budget
// has its own TTFT and e2e and no worker fields. `pdserve.cache` (and the
// log line's cache, and pdserve_response_cache_requests_total{result}) is
// "hit" or "miss" per prompt; an unseeded sampled request is not looked
// up and has none. There is no single-flight: identical requests at once
// each miss and run.
//
// With API keys the cache is partitioned by key (its SHA-256 leads the
// cache key): a hit, and its speed, would tell a tenant what another
// asked. The policy's response_cache.share_across_keys shares it across keys instead.
// Without API keys there is one partition.
//
// # Choices
//
// With Options.MaxChoices (the largest batch the decode workers report
// in their heartbeats) an n over it is a 400 invalid_value on "n" naming
// the limit, before any worker is asked.
//
// A Server is safe for concurrent use.
//
// # Responses API
//
// POST /v1/responses (responses.go, respout.go, respapi.go) validates
// OpenAI's ResponseCreateParams (refusing, by name, what pdserve cannot
// do), turns the request into a chat completions body (instructions, the
// stored conversation of previous_response_id, the input items) and runs
// it on the chat path (serve with a bodyTransform), so admission, API
// keys, rate limits, tools, grammars, the reasoning parser and the budget
// are the chat path's. A chatTap turns the chat reply into a Response
// object, or, streamed, each chat chunk into the Responses API's events
// as it comes (so a client that does not read stalls the generation as
// on chat). Stored responses live in a ResponseStore (pkg/respstore,
// NATS JetStream key-value), owned by the SHA-256 of the API key that
// made them: another key gets 404. GET /v1/responses with a WebSocket
// upgrade (respws.go) runs response.create events on the same path.
// docs/api.md is the user guide.
//
// # Messages API
//
// POST /v1/messages (messages.go, msgout.go) is Anthropic's Messages API
// on the chat path in the same way: parseMessages validates the body
// (model and max_tokens required; system, stop_sequences, temperature
// [0, 1], top_p, metadata.user_id, client tools with input_schema,
// tool_choice auto/any/tool/none with disable_parallel_tool_use,
// cache_control accepted as a no-op since prefixes are cached anyway,
// thinking only "disabled"; top_k, server tools, images, documents,
// containers, MCP servers and the like refused with a 400 naming them)
// and turns it into a chat body; a chatTap turns the reply into a
// Message (text, thinking and tool_use blocks, stop_reason end_turn,
// max_tokens, stop_sequence with the sequence, or tool_use; usage with
// the prefix-cache hits as cache_read_input_tokens) or into the
// message_start, ping, content_block_start/delta/stop, message_delta and
// message_stop events. Errors are Anthropic's {"type":"error","error":
// {"type","message"},"request_id"}, the parameter named in the message;
// a full server or no worker is 529 overloaded_error. API keys are read
// from x-api-key too (on every route); the anthropic-version header is
// accepted, whatever its value.
package frontend
