package frontend

import (
	"context"
	"net"
	"syscall"
	"time"
)

// connCtx is the context key of a connection's socket (syscall.RawConn).
type connCtx struct{}

// ConnContext is the http.Server ConnContext of the coordinator's client
// listener: it keeps the accepted connection's socket in the
// connection's context, so that each request on it samples its client's
// network round trip (the budget's client_rtt_ms, counted in the TTFT
// budget; see budget.Trace.ClientRTT). It only reads the socket's
// options: the connection, TLS or HTTP/2 on it, is served as before. A
// TLS connection (*tls.Conn, as http.Server.ServeTLS accepts it) is
// looked through to its TCP connection; a connection that is not TCP
// (a Unix socket, an in-memory pipe) has no RTT.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		return ctx
	}
	rc, err := tcp.SyscallConn()
	if err != nil {
		return ctx
	}
	return context.WithValue(ctx, connCtx{}, rc)
}

// clientRTT returns the smoothed round trip of the TCP connection ctx's
// request arrived on, as the kernel measures it now, and whether it
// could be measured: not without ConnContext, on a connection that is
// not TCP, on a closed one, or on an OS without TCP_INFO.
func clientRTT(ctx context.Context) (time.Duration, bool) {
	rc, ok := ctx.Value(connCtx{}).(syscall.RawConn)
	if !ok {
		return 0, false
	}
	return socketRTT(rc)
}
