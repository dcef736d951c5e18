package control

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
)

// embeddedReady bounds how long StartEmbedded waits for the server to accept
// connections.
const embeddedReady = 10 * time.Second

// natsDefaultPort is the port nats-server listens on for port 0.
const natsDefaultPort = 4222

// ErrAddrInUse is wrapped by StartEmbedded when something else listens on
// the address (another NATS server, another coordinator's embedded one).
var ErrAddrInUse = errors.New("address in use")

// EmbeddedOption configures StartEmbedded.
type EmbeddedOption func(*embeddedConfig)

type embeddedConfig struct {
	users []NATSUser
	auth  bool
	log   *zap.Logger
	// jsDir and jsMax: JetStream's store directory and its bound on
	// memory and on disk (bytes); jsDir "" without JetStream.
	jsDir string
	jsMax int64
	// leaf: the region gateway's leafnode this server connects to, nil
	// without.
	leaf *url.URL
}

// regionLocal are the subjects that never leave a region: the workers'
// heartbeats, commands and KV events, plans, replies, JetStream.
var regionLocal = []string{heartbeatPrefix + ">", commandPrefix + ">", KVWildcard, PlanSubject, inboxWildcard, "$JS.>", "$KV.>", "$SYS.>"}

// WithLeafRemote connects the server to the leafnode listener of a
// region's gateway server (StartGateway), through which only the region
// subjects cross to the other regions.
func WithLeafRemote(g *Gateway) EmbeddedOption {
	return func(c *embeddedConfig) { c.leaf = g.leafURL }
}

// WithJetStream enables JetStream (the stored responses' key-value
// bucket, pkg/respstore), its files in dir (which the caller made and
// removes after the server stopped), bounded to maxBytes of memory and
// as many on disk.
func WithJetStream(dir string, maxBytes int64) EmbeddedOption {
	return func(c *embeddedConfig) { c.jsDir, c.jsMax = dir, maxBytes }
}

// WithUsers makes the server require credentials: only users log in,
// each with the permissions of its role (Permissions). Without it the
// server accepts anyone with every permission: for tests only; the
// coordinator always passes its users.
func WithUsers(users []NATSUser) EmbeddedOption {
	return func(c *embeddedConfig) { c.users, c.auth = users, true }
}

// WithLogger makes the server log its errors and warnings to log: refused
// logins (naming the user, never the password), permission violations
// (naming the subject), slow consumers. Notices go to debug.
func WithLogger(log *zap.Logger) EmbeddedOption {
	return func(c *embeddedConfig) { c.log = log }
}

// StartEmbedded runs a nats-server in this process, listening on addr
// ("host:port"; port -1 picks a free one, e.g. "127.0.0.1:-1"; port 0 is
// the NATS default, 4222), without signal handlers, with JetStream only
// WithJetStream, logging
// only with WithLogger, requiring credentials only WithUsers. It listens
// in plaintext: for NATS across machines with TLS, run a nats-server of
// your own. It returns once the server accepts connections, with its
// client URL ("nats://host:port", no credentials). The caller stops it
// with Shutdown and WaitForShutdown. Errors: a bad addr; invalid users
// (ValidateUsers), or WithUsers with none; ErrAddrInUse (wrapped, at once:
// the address is tried before the server starts, since nats-server
// reports a failed listen only by never becoming ready); other listen
// errors; a server not ready within 10 s.
func StartEmbedded(addr string, opts ...EmbeddedOption) (*server.Server, string, error) {
	var cfg embeddedConfig
	for _, o := range opts {
		o(&cfg)
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < -1 || port > 65535 {
		return nil, "", fmt.Errorf("control: embedded nats %q: bad port", addr)
	}
	sopts := &server.Options{
		Host:   host,
		Port:   port,
		NoLog:  cfg.log == nil,
		NoSigs: true,
	}
	if cfg.jsDir != "" {
		sopts.JetStream, sopts.StoreDir = true, cfg.jsDir
		sopts.JetStreamMaxMemory, sopts.JetStreamMaxStore = cfg.jsMax, cfg.jsMax
	}
	if cfg.leaf != nil {
		// The gateway server's leaf user is allowed the region subjects
		// only; the region's own traffic is denied here too, both ways.
		sopts.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: []*url.URL{cfg.leaf}, DenyImports: regionLocal, DenyExports: regionLocal}}
	}
	if cfg.auth {
		if len(cfg.users) == 0 {
			return nil, "", fmt.Errorf("control: embedded nats %q: no users", addr)
		}
		if sopts.Users, sopts.Nkeys, err = serverUsers(cfg.users); err != nil {
			return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
		}
	}
	if port != -1 {
		if err := tryListen(host, port); err != nil {
			return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
		}
	}
	s, err := server.NewServer(sopts)
	if err != nil {
		return nil, "", fmt.Errorf("control: embedded nats %q: %w", addr, err)
	}
	if cfg.log != nil {
		s.SetLoggerV2(serverLogger{cfg.log.Sugar()}, false, false, false)
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

// serverLogger is nats-server's Logger on zap.
type serverLogger struct{ l *zap.SugaredLogger }

func (l serverLogger) Noticef(format string, v ...any) { l.l.Debugf(format, v...) }
func (l serverLogger) Warnf(format string, v ...any) {
	// Generated in-process passwords are plain text by design; the
	// coordinator warns about plain-text passwords in a users file itself.
	if strings.HasPrefix(format, "Plaintext passwords detected") {
		return
	}
	l.l.Warnf(format, v...)
}
func (l serverLogger) Fatalf(format string, v ...any) { l.l.Errorf(format, v...) }
func (l serverLogger) Errorf(format string, v ...any) { l.l.Errorf(format, v...) }
func (l serverLogger) Debugf(format string, v ...any) { l.l.Debugf(format, v...) }
func (l serverLogger) Tracef(format string, v ...any) { l.l.Debugf(format, v...) }

var _ server.Logger = serverLogger{}
