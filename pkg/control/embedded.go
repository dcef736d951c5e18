package control

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// embeddedReady bounds how long StartEmbedded waits for the server to accept
// connections.
const embeddedReady = 10 * time.Second

// StartEmbedded runs a nats-server in this process, listening on addr
// ("host:port"; port -1 picks a free one, e.g. "127.0.0.1:-1"; port 0 is
// the NATS default, 4222), without logging, signal handlers or JetStream.
// It returns once the server accepts connections, with its client URL
// ("nats://host:port"). The caller stops it with Shutdown and
// WaitForShutdown.
func StartEmbedded(addr string) (*server.Server, string, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return nil, "", fmt.Errorf("control: embedded nats %q: bad port", addr)
	}
	s, err := server.NewServer(&server.Options{
		Host:   host,
		Port:   port,
		NoLog:  true,
		NoSigs: true,
	})
	if err != nil {
		return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
	}
	go s.Start()
	if !s.ReadyForConnections(embeddedReady) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, "", fmt.Errorf("control: embedded nats %q: not ready after %v", addr, embeddedReady)
	}
	return s, s.ClientURL(), nil
}
