// Package chattmpl renders chat requests through a model's own chat
// template and parses the model's tool calls and reasoning out of its
// reply.
//
// # Templates
//
// GGUF's tokenizer.chat_template is Jinja (Hugging Face's dialect).
// Compile runs it with github.com/ardanlabs/jinja, a pure-Go engine built
// for exactly these templates (HF's globals raise_exception and
// strftime_now, Python's string methods, tojson with json.dumps'
// separators, namespace(), loop controls) and tested against the
// templates of current GGUF models; gonja/v2 is a general Jinja2 port
// without those. Render passes messages (role, content, name,
// tool_call_id, tool_calls with arguments as an object when they are a
// JSON object, as vLLM does), tools (each as the request gave it, keys in
// their order), bos_token, eos_token and add_generation_prompt. A
// template that does not mention tools gets them from Generic: described
// in Hermes' format in the system message, tool calls and results as
// text, as Qwen 2.5's template writes them. tojson with indent sorts
// object keys (the engine's encoder); without, key order is kept.
//
// # Tool-call formats
//
// The format is chosen from the template's text: a template that writes
// <tool_call> is Hermes (Qwen 2.5, Qwen3, Hermes): each call a
// <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call> block; a Llama
// 3 template (<|start_header_id|> and "parameters") is Llama 3's JSON: the
// reply is {"name": …, "parameters": {…}} (several separated by ";"). A
// template that renders tools otherwise (gemma 4, Mistral, Command R's
// tool template) is FormatUnknown, and Render refuses tools with
// ErrUnknownFormat. A template that renders no tools is Hermes (Generic).
//
// Grammar builds the GBNF grammar of tool_choice "required" or a named
// function: the call syntax of the format around each tool's parameter
// schema (pkg/grammar), so that even a model of random weights writes a
// call that parses and whose arguments validate.
//
// # Reasoning
//
// A Parser splits a reply as it streams: a leading <think>…</think> (or,
// when the prompt already opened <think>, as DeepSeek-R1's template does,
// everything up to </think>) is reasoning; the rest is answer text and
// tool calls. It holds back only what may still be markup.
//
// Templates are immutable and safe for concurrent use; a Parser is not.
package chattmpl
