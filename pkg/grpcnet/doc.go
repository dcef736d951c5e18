// Package grpcnet holds the transport settings of the gRPC connections
// between pdserve components, the same on both sides of every connection:
// TLS (TLSOptions: --tls-cert, --tls-key, --tls-ca, --tls-server-name;
// certificates reloaded when their files change) and HTTP/2 keepalive
// (KeepaliveOptions: --grpc-keepalive-time, --grpc-keepalive-timeout).
// The coordinator dials with them and the workers serve and dial with
// them, so neither side imports the other for its transport. Who may call
// what over those connections is package grpcauth's job.
package grpcnet
