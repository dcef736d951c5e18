// Package agentloop runs agent loops against an OpenAI-compatible server
// and times them: each loop is a user task followed by Turns turns, each
// turn one forced function call (tool_choice "required", one function,
// parallel_tool_calls false) whose synthetic output the next turn sends
// back. Two transports:
//
//   - WS: the Responses API's WebSocket mode (GET /v1/responses upgraded),
//     one socket per loop; each turn is a response.create event that
//     continues the last response by previous_response_id and carries
//     only the new input, the function_call_output (store false: the
//     socket keeps the conversation).
//   - HTTP: POST /v1/chat/completions, streamed, resending the whole
//     conversation each turn over a kept-alive connection.
//
// Per turn it records the client's TTFT (request written → first event or
// chunk that carries output: an output item, a delta, a tool-call delta),
// the server's own TTFT and prefix-cache hit from the pdserve budget, the
// prompt tokens, and the bytes the client sent; per loop the end-to-end
// time from its first request to its last turn's end. The tool runs in no
// time: the loop's time is the server's and the transport's.
//
// Prompts: Options.Tag salts the instructions, so that two runs on one
// server share no prefix; the instructions are shared by the loops of a
// run (a common system prompt), the task and tool outputs are each loop's
// own. Text is lowercase English words (one token per byte on pdserve's
// byte-level models).
//
// Run is safe to call concurrently; it owns its connections and closes
// them before it returns.
package agentloop
