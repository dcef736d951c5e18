// Package client sends one benchmark request to an OpenAI-compatible
// endpoint (/v1/completions or /v1/chat/completions, streaming by default)
// and times it from the client's side: the send, every token-carrying
// Server-Sent Event, the end. It also keeps the server's usage counts and
// the per-request budget object ("pdserve") when the server sends one.
//
// Time comes from an injectable Clock, read once when the request is sent
// and once per SSE data line as it is read, so tests that script the
// server's timing get exact figures. A Client is safe for concurrent use.
package client
