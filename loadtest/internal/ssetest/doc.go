// Package ssetest is a scripted OpenAI-compatible SSE server for tests, with
// a fake clock that the server moves: before each event it sets the clock to
// the event's scripted time, writes and flushes the event, then waits until
// the client has read the clock (the client stamps each event as it reads
// it). Client-side timings therefore equal the script exactly, with no
// sleeping. One request at a time may use a Server's clock.
package ssetest
