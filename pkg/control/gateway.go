package control

import (
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
)

// Gateway is the NATS server of a region's gateway (package region): a
// gateway of the regions' supercluster, and a leafnode hub that the
// region's own embedded server connects to (WithLeafRemote). It stands
// apart from the region's server for two reasons: only the region
// subjects (RegionWildcard) cross between the two, so no heartbeat,
// command or KV event of one region reaches another; and a server that
// is a gateway runs JetStream only clustered, while the region's server
// keeps its JetStream (the stored responses) standalone. Its client port
// takes no logins (a random token nobody is given).
type Gateway struct {
	s       *server.Server
	leafURL *url.URL
}

// StartGateway starts the gateway server of region name: the gateway
// listener on listen ("host:port"; port 0 picks a free one), the remote
// gateways (region → URLs) dialed with remoteTLS, gateway connections
// accepted with tlsCfg (mutual TLS when it requires client
// certificates; nats-server also solicits the gateways it learns of
// with it), and a leafnode listener on loopback for the region's server
// only (a generated user allowed the region subjects). Errors: a bad
// listen address, the server's.
func StartGateway(name, listen string, remotes map[string][]*url.URL, tlsCfg, remoteTLS *tls.Config, log *zap.Logger) (*Gateway, error) {
	host, port, err := net.SplitHostPort(listen)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil || p < 0 || p > 65535 {
		return nil, fmt.Errorf("control: region gateway listen %q: want host:port", listen)
	}
	if p == 0 {
		p = -1 // a free port; 0 turns the gateway off
	}
	leafPort, err := freeLoopbackPort()
	if err != nil {
		return nil, fmt.Errorf("control: region gateway: leafnode port: %w", err)
	}
	leaf := NewNATSUser(RoleCoordinator, "") // a generated name and password
	perms := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{RegionWildcard}},
		Subscribe: &server.SubjectPermission{Allow: []string{RegionWildcard}},
	}
	opts := &server.Options{
		ServerName:    "pdserve-region-gateway-" + name,
		Host:          "127.0.0.1",
		Port:          -1,
		Authorization: NewNATSUser(RoleCoordinator, "").Password, // no client logs in
		// nats-server requires a system account with leafnodes and gateways.
		SystemAccount: "SYS",
		Accounts:      []*server.Account{server.NewAccount("SYS")},
		NoLog:         log == nil,
		NoSigs:        true,
		Gateway:       server.GatewayOpts{Name: name, Host: host, Port: p, TLSConfig: tlsCfg},
		LeafNode: server.LeafNodeOpts{
			Host: "127.0.0.1", Port: leafPort,
			Users: []*server.User{{Username: leaf.User, Password: leaf.Password, Permissions: perms}},
		},
	}
	if tlsCfg != nil {
		opts.Gateway.TLSTimeout = gatewayTLSTimeout
	}
	for _, n := range slices.Sorted(maps.Keys(remotes)) {
		r := &server.RemoteGatewayOpts{Name: n, URLs: remotes[n]}
		if remoteTLS != nil {
			r.TLSConfig = remoteTLS.Clone()
			r.TLSTimeout = gatewayTLSTimeout
		}
		opts.Gateway.Gateways = append(opts.Gateway.Gateways, r)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("control: region gateway: %w", err)
	}
	if log != nil {
		s.SetLoggerV2(serverLogger{log.Sugar()}, false, false, false)
	}
	go s.Start()
	if !s.ReadyForConnections(embeddedReady) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("control: region gateway on %s: not ready after %v", listen, embeddedReady)
	}
	la := net.JoinHostPort("127.0.0.1", strconv.Itoa(leafPort))
	return &Gateway{s: s, leafURL: &url.URL{Scheme: "nats", User: url.UserPassword(leaf.User, leaf.Password), Host: la}}, nil
}

// freeLoopbackPort returns a port free on 127.0.0.1 now (nats-server
// does not tell the port of a leafnode listener it picked).
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr returns the gateway listener's address.
func (g *Gateway) Addr() string {
	if a := g.s.GatewayAddr(); a != nil {
		return a.String()
	}
	return ""
}

// Shutdown stops the server and waits until it stopped. Safe on nil.
func (g *Gateway) Shutdown() {
	if g == nil {
		return
	}
	g.s.Shutdown()
	g.s.WaitForShutdown()
}

// gatewayTLSTimeout bounds a gateway connection's TLS handshake, seconds:
// generous, since a region's link may be slow and its host loaded.
const gatewayTLSTimeout = 10
