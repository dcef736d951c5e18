package control

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// embeddedReady bounds how long StartEmbedded waits for the server to accept
// connections.
const embeddedReady = 10 * time.Second

// natsDefaultPort is the port nats-server listens on for port 0.
const natsDefaultPort = 4222

// ErrAddrInUse is wrapped by StartEmbedded when something else listens on
// the address (another NATS server, another coordinator's embedded one).
var ErrAddrInUse = errors.New("address in use")

// StartEmbedded runs a nats-server in this process, listening on addr
// ("host:port"; port -1 picks a free one, e.g. "127.0.0.1:-1"; port 0 is
// the NATS default, 4222), without logging, signal handlers or JetStream.
// It returns once the server accepts connections, with its client URL
// ("nats://host:port"). The caller stops it with Shutdown and
// WaitForShutdown. Errors: a bad addr; ErrAddrInUse (wrapped, at once:
// the address is tried before the server starts, since nats-server
// reports a failed listen only by never becoming ready); other listen
// errors; a server not ready within 10 s.
func StartEmbedded(addr string) (*server.Server, string, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return nil, "", fmt.Errorf("control: embedded nats %q: bad port", addr)
	}
	if port != -1 {
		if err := tryListen(host, port); err != nil {
			return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
		}
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
		if port != -1 {
			// Taken between the check and the server's own listen?
			if err := tryListen(host, port); err != nil {
				return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
			}
		}
		return nil, "", fmt.Errorf("control: embedded nats %q: not ready after %v", addr, embeddedReady)
	}
	return s, s.ClientURL(), nil
}

// tryListen opens and closes a TCP listener on host:port (0: the NATS
// default). Errors: ErrAddrInUse wrapping the listen error, or the listen
// error.
func tryListen(host string, port int) error {
	if port == 0 {
		port = natsDefaultPort
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%w (another NATS server or pdserve coordinator listens there): %w", ErrAddrInUse, err)
	case err != nil:
		return err
	}
	return l.Close()
}
