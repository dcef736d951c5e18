// Package tracingtest is an in-process OTLP trace receiver for tests: the
// collector's TraceService (go.opentelemetry.io/proto/otlp) over gRPC on
// 127.0.0.1, and OTLP/HTTP's POST /v1/traces (protobuf) on an httptest
// server. It keeps every span it was sent.
package tracingtest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span with the service.name of its resource.
type Span struct {
	Service string
	*tracepb.Span
}

// Receiver receives OTLP traces. Safe for concurrent use.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer

	mu    sync.Mutex
	spans []Span
	calls int

	grpc *grpc.Server
	lis  net.Listener
	http *httptest.Server
}

// Start starts a receiver on 127.0.0.1 (gRPC and HTTP), stopped when the
// test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{grpc: grpc.NewServer()}
	coltracepb.RegisterTraceServiceServer(r.grpc, r)
	var err error
	if r.lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.grpc.Serve(r.lis) }()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	r.http = httptest.NewServer(mux)
	t.Cleanup(func() {
		r.grpc.Stop()
		r.http.Close()
	})
	return r
}

// GRPCEndpoint is the gRPC receiver's URL (for protocol grpc).
func (r *Receiver) GRPCEndpoint() string { return "http://" + r.lis.Addr().String() }

// HTTPEndpoint is the HTTP receiver's base URL (for protocol
// http/protobuf: the exporter appends /v1/traces).
func (r *Receiver) HTTPEndpoint() string { return r.http.URL }

// Export implements the collector's TraceService.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, hr *http.Request) {
	data, err := io.ReadAll(io.LimitReader(hr.Body, 64<<20))
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(data, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&req)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{Service: service, Span: s})
			}
		}
	}
}

// Spans returns the spans received so far, in arrival order.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Exports returns the number of export calls received.
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// Attr returns the value of span attribute key (a string, int64, bool
// or float64) and whether the span has it.
func Attr(s *tracepb.Span, key string) (any, bool) {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() != key {
			continue
		}
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue, true
		case *commonpb.AnyValue_IntValue:
			return v.IntValue, true
		case *commonpb.AnyValue_BoolValue:
			return v.BoolValue, true
		case *commonpb.AnyValue_DoubleValue:
			return v.DoubleValue, true
		}
		return nil, true
	}
	return nil, false
}
