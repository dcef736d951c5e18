package frontend

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"runtime"
	"testing"
)

// TestClientRTT: the RTT of a request's connection is measured on a real
// TCP connection over loopback, plain or under TLS (looked through to
// its TCP connection), and is absent on a connection that is not TCP (a
// pipe, a Unix socket) or without ConnContext; off Linux it is never
// measured.
func TestClientRTT(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	client, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	// A round trip on the connection, so that the kernel has a sample of
	// the data path too.
	go func() {
		buf := make([]byte, 1)
		if _, err := server.Read(buf); err == nil {
			_, _ = server.Write(buf)
		}
	}()
	if _, err := client.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}

	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	unixLis, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer unixLis.Close()
	unixClient, err := net.Dial("unix", unixLis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer unixClient.Close()

	linux := runtime.GOOS == "linux"
	for _, tc := range []struct {
		name string
		conn net.Conn
		want bool
	}{
		{"tcp", server, linux},
		{"tls over tcp", tls.Server(server, &tls.Config{}), linux},
		{"pipe", p1, false},
		{"unix socket", unixClient, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rtt, ok := clientRTT(ConnContext(context.Background(), tc.conn))
			if ok != tc.want || rtt < 0 || (!ok && rtt != 0) {
				t.Errorf("clientRTT = %v, %v; want measured %v (≥ 0)", rtt, ok, tc.want)
			}
		})
	}
	if rtt, ok := clientRTT(context.Background()); ok || rtt != 0 {
		t.Errorf("without ConnContext: clientRTT = %v, %v; want none", rtt, ok)
	}
	// A closed connection has none.
	_ = server.Close()
	if _, ok := clientRTT(ConnContext(context.Background(), server)); ok {
		t.Error("closed connection: measured")
	}
}
