// Package frontend is pdserve's OpenAI-compatible HTTP surface:
// POST /v1/completions and /v1/chat/completions (Server-Sent Events when
// "stream": true, a JSON body otherwise), GET /v1/models, /healthz
// (liveness), /readyz (readiness) and /metrics (Prometheus).
//
// The frontend parses and validates a request, tokenizes it, enforces the
// prompt-token budget of its surface and the max_tokens cap (400 with an
// OpenAI-shaped error otherwise), then hands it to a Backend, which streams
// output tokens back through an EmitFunc. The frontend turns tokens into
// text (holding back bytes of an incomplete UTF-8 sequence and any text that
// may be the start of a stop string), writes each SSE event and flushes it
// at once, and ends the stream with `data: [DONE]`. The last chunk of a
// stream (the usage chunk when stream_options.include_usage is set) and a
// non-streaming response carry a `pdserve` object with the request's
// latency budget (see pkg/budget). Each request ends in one zap log line
// and one observation in pkg/metrics.
//
// # Errors
//
// Errors are JSON {"error":{"message","type","param","code"}}. Malformed
// JSON, an unknown model, an empty prompt, a prompt over its budget,
// max_tokens over the cap, n ≠ 1 and other unsupported options get 400.
// So does a prompt whose tokens plus max_tokens exceed the model's context
// length (its max_model_len), with code context_length_exceeded and
// OpenAI's wording, before any worker is asked. A Backend error wrapping ErrOverloaded gets 429 with Retry-After, one
// wrapping ErrUnavailable gets 503, ErrInvalid 400, anything else 500. An
// error after the stream started is sent as a final `data: {"error":...}`
// event followed by `data: [DONE]`.
//
// # Prompts
//
// "prompt" is a string, an array of token ids, or a one-element array of
// either; larger arrays (batched prompts) get a 400. Text is tokenized
// with the engine's tokenizer; no BOS token is added.
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
// tokenizer carries the model's own chat template (it implements
// engine.ChatTemplater, as llama.cpp's does with the template in the GGUF
// metadata), the messages are rendered by it, roles passed as given, and
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
// tokens, omitted while unknown.
//
// # Surfaces and budgets
//
// A request's surface is its API key (Authorization: Bearer KEY) when the
// policy lists that key, else its route. Keys only select budgets: the
// frontend does not authenticate.
//
// A Server is safe for concurrent use.
package frontend
