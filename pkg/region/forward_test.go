package region

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdserve/pdserve/pkg/grpcnet"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// freezer is a TCP proxy whose links stop carrying bytes, without
// closing, once frozen: a cut link as a pooled connection sees it.
type freezer struct {
	lis    net.Listener
	mu     sync.Mutex
	frozen chan struct{}
	conns  []net.Conn
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{lis: lis, frozen: make(chan struct{})}
	t.Cleanup(func() {
		_ = lis.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, u)
			f.mu.Unlock()
			go f.pipe(c, u)
			go f.pipe(u, c)
		}
	}()
	return f
}

// pipe copies src to dst until frozen: then it stops reading (the bytes
// in flight are dropped), leaving both connections open.
func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-f.frozen:
			<-make(chan struct{}) // a black hole: never returns until the test ends and closes src
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() { close(f.frozen) }

// TestForwardPassesOverDeadPooledConnection: a request sent to a peer
// over a pooled connection whose link went dead (no RST, no FIN: a cut
// link) fails with a clear 502 before the request's context ends, since
// the forwarder's HTTP/2 health check closes the connection (before it
// had one, the request hung until the context, here 60 s, ran out); it
// is not sent to the next candidate, since the peer may have run it
// (before, it was: a request served twice). The next request, which
// cannot reach the peer (its handshake over the dead link times out), is
// passed over to the next candidate.
func TestForwardPassesOverDeadPooledConnection(t *testing.T) {
	ca := tlstest.NewCA(t, "region test CA")
	leaf := ca.Issue(t, tlstest.Leaf{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	tl, err := grpcnet.TLSOptions{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile, CAFile: ca.CertFile}.Load(grpcnet.TLSServe|grpcnet.TLSDial, nil)
	if err != nil {
		t.Fatal(err)
	}
	var hits sync.Map // region → *atomic.Int32
	peer := func(name string) string {
		n := new(atomic.Int32)
		hits.Store(name, n)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{TLSConfig: tl.ServerConfig(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			n.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"region":"`+name+`"}`)
		})}
		go func() { _ = srv.ServeTLS(lis, "", "") }()
		t.Cleanup(func() { _ = srv.Close() })
		return lis.Addr().String()
	}
	a, b := peer("a"), peer("b")
	fz := newFreezer(t, a)
	viaA := Candidate{Region: "a", URL: "https://" + fz.lis.Addr().String()}
	f := NewForwarder("origin", tl, nil)
	defer f.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := httptest.NewRecorder()
	if out := f.Forward(ctx, w, []byte(`{}`), Request{Path: "/v1/chat/completions", Header: http.Header{}}, []Candidate{viaA}); out.Region != "a" || out.Err != nil {
		t.Fatalf("before the cut: %+v", out)
	}
	fz.freeze()
	w = httptest.NewRecorder()
	out := f.Forward(ctx, w, []byte(`{}`), Request{Path: "/v1/chat/completions", Header: http.Header{}},
		[]Candidate{viaA, {Region: "b", URL: "https://" + b}})
	if out.Region != "a" || out.Status != http.StatusBadGateway || out.Err == nil || ctx.Err() != nil || len(out.Tried) != 0 {
		t.Fatalf("sent over the cut: served by %q status %d (tried %v, err %v, ctx %v), want a's clear failure", out.Region, out.Status, out.Tried, out.Err, ctx.Err())
	}
	if n, _ := hits.Load("b"); w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), "may have run there") || w.Header().Get(HeaderServed) != "a" || n.(*atomic.Int32).Load() != 0 {
		t.Fatalf("sent over the cut: %d %q, b served %d; want a 502 saying so, b never asked", w.Code, w.Body.String(), n.(*atomic.Int32).Load())
	}
	w = httptest.NewRecorder()
	out = f.Forward(ctx, w, []byte(`{}`), Request{Path: "/v1/chat/completions", Header: http.Header{}},
		[]Candidate{viaA, {Region: "b", URL: "https://" + b}})
	if out.Region != "b" || out.Err != nil || ctx.Err() != nil {
		t.Fatalf("after the cut: served by %q (tried %v, err %v, ctx %v), want b", out.Region, out.Tried, out.Err, ctx.Err())
	}
	if got := w.Body.String(); got != `{"region":"b"}` {
		t.Errorf("body %q, want b's", got)
	}
}

// TestForwardPassesOverPeerThatClosed: a peer that read the whole
// request and then closed the connection (its process died; its server
// cancelled the request with the connection) is passed over for the
// next candidate, unlike one that went silent.
func TestForwardPassesOverPeerThatClosed(t *testing.T) {
	ca := tlstest.NewCA(t, "region test CA")
	leaf := ca.Issue(t, tlstest.Leaf{IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	tl, err := grpcnet.TLSOptions{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile, CAFile: ca.CertFile}.Load(grpcnet.TLSServe|grpcnet.TLSDial, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := tl.ServerConfig().Clone()
	cfg.NextProtos = []string{"http/1.1"}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	var read atomic.Int32
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			if r, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				if _, err := io.ReadAll(r.Body); err == nil {
					read.Add(1)
				}
			}
			_ = c.Close()
		}
	}()
	blis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: tl.ServerConfig(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"region":"b"}`)
	})}
	go func() { _ = srv.ServeTLS(blis, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	f := NewForwarder("origin", tl, nil)
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := httptest.NewRecorder()
	out := f.Forward(ctx, w, []byte(`{}`), Request{Path: "/v1/chat/completions", Header: http.Header{}},
		[]Candidate{{Region: "a", URL: "https://" + lis.Addr().String()}, {Region: "b", URL: "https://" + blis.Addr().String()}})
	if out.Region != "b" || out.Err != nil || len(out.Tried) != 1 || read.Load() != 1 {
		t.Fatalf("served by %q (tried %v, err %v; a read %d requests), want b after a read it and closed", out.Region, out.Tried, out.Err, read.Load())
	}
	if got := w.Body.String(); got != `{"region":"b"}` {
		t.Errorf("body %q, want b's", got)
	}
}
