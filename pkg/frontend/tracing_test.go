package frontend

import (
	"context"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdserve/pdserve/pkg/tracing"
)

// TestTracedResponses: with a TracerProvider every completion request
// has an HTTP server span continuing the client's traceparent, with the
// response's status code (an error for 5xx only) and the traceresponse
// header; each prompt its request span under it, whose context reaches
// the Backend, with the outcome; each log line the trace id. A refused
// request has its HTTP span and no request span.
func TestTracedResponses(t *testing.T) {
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	unavailable := func(context.Context, *Request, EmitFunc) ([]string, error) {
		return nil, NewError(ErrUnavailable, "no_workers", "", "No worker now.")
	}
	for _, tc := range []struct {
		name     string
		complete func(context.Context, *Request, EmitFunc) ([]string, error)
		body     string
		status   int
		// requests: the pdserve.status of each request span expected
		// (none when the request was refused before the Backend).
		requests []string
		failed   bool // the HTTP span's status is an error
	}{
		{name: "ok", complete: echoText("hi"), body: `{"model":"tiny","prompt":"x","max_tokens":2}`, status: 200, requests: []string{"ok"}},
		{name: "batch", complete: echoText("hi"), body: `{"model":"tiny","prompt":["x","y"],"max_tokens":2}`, status: 200, requests: []string{"ok", "ok"}},
		{name: "invalid", complete: echoText("hi"), body: `{"model":`, status: 400},
		{name: "unavailable", complete: unavailable, body: `{"model":"tiny","prompt":"x","max_tokens":2}`, status: 503,
			requests: []string{"unavailable"}, failed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			core, logs := observer.New(zap.InfoLevel)
			var backendSpans atomic.Int32 // the prompts of a batch run at once
			b := &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
				if tracing.Recording(ctx) {
					backendSpans.Add(1)
				}
				return tc.complete(ctx, req, emit)
			}}
			ts := newTestServer(t, b, func(o *Options) { o.TracerProvider, o.Logger = tp, zap.New(core) })
			resp := ts.post(t, RouteCompletions, tc.body, "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			_ = resp.Body.Close()
			ts.Close() // the handler has returned: its span ended

			var httpSpan sdktrace.ReadOnlySpan
			var requests []string
			for _, s := range rec.Ended() {
				if got := s.SpanContext().TraceID().String(); got != traceID {
					t.Errorf("span %s in trace %s, want the client's %s", s.Name(), got, traceID)
				}
				switch s.Name() {
				case "POST " + RouteCompletions:
					httpSpan = s
				case tracing.SpanRequest:
					requests = append(requests, attr(s, "pdserve.status").AsString())
				}
			}
			if httpSpan == nil {
				t.Fatal("no HTTP span")
			}
			if got := attr(httpSpan, "http.response.status_code").AsInt64(); got != int64(tc.status) {
				t.Errorf("http.response.status_code %d, want %d", got, tc.status)
			}
			if failed := httpSpan.Status().Code == codes.Error; failed != tc.failed {
				t.Errorf("HTTP span failed %v, want %v", failed, tc.failed)
			}
			if want := "00-" + traceID + "-" + httpSpan.SpanContext().SpanID().String() + "-01"; resp.Header.Get("traceresponse") != want {
				t.Errorf("traceresponse %q, want %q", resp.Header.Get("traceresponse"), want)
			}
			if !slices.Equal(requests, tc.requests) {
				t.Errorf("request spans with status %v, want %v", requests, tc.requests)
			}
			if n := int(backendSpans.Load()); n != len(tc.requests) {
				t.Errorf("the Backend saw a recording span %d times, want %d", n, len(tc.requests))
			}
			lines := logs.FilterMessage("request").All()
			if len(lines) == 0 {
				t.Fatal("no request log line")
			}
			for _, l := range lines {
				if got := l.ContextMap()["trace_id"]; got != traceID {
					t.Errorf("log line trace_id %v, want %s", got, traceID)
				}
			}
		})
	}
}

// attr returns span attribute key (an empty value when absent).
func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// TestUntracedByDefault: without a TracerProvider no traceresponse, no
// trace_id, and the Backend's context has no recording span.
func TestUntracedByDefault(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	recording := false
	b := &fakeBackend{complete: func(ctx context.Context, req *Request, emit EmitFunc) ([]string, error) {
		recording = tracing.Recording(ctx)
		return echoText("hi")(ctx, req, emit)
	}}
	ts := newTestServer(t, b, func(o *Options) { o.Logger = zap.New(core) })
	resp := ts.post(t, RouteCompletions, `{"model":"tiny","prompt":"x","max_tokens":2}`, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("traceresponse") != "" || recording {
		t.Errorf("status %d, traceresponse %q, Backend span recording %v; want 200, none, false", resp.StatusCode, resp.Header.Get("traceresponse"), recording)
	}
	for _, l := range logs.FilterMessage("request").All() {
		if _, ok := l.ContextMap()["trace_id"]; ok {
			t.Errorf("log line has trace_id untraced")
		}
	}
}
