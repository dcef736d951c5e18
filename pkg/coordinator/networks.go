package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Default worker networks (--worker-networks): where the coordinator may
// dial a worker's heartbeat address. Standalone, the workers are in the
// process: loopback. Otherwise the private ranges a pod or machine
// network uses (RFC 1918, RFC 6598 shared space, IPv6 unique local) and
// loopback: never a public address, nor link-local (169.254.0.0/16 holds
// the clouds' metadata services).
const (
	StandaloneWorkerNetworks = "127.0.0.0/8,::1/128"
	DefaultWorkerNetworks    = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7," + StandaloneWorkerNetworks
)

// errOutsideNetworks: a worker address outside --worker-networks.
var errOutsideNetworks = errors.New("outside --worker-networks")

// networks is a parsed --worker-networks list.
type networks []netip.Prefix

// parseNetworks parses a comma-separated list of CIDR prefixes. Errors:
// an empty list, a prefix that does not parse.
func parseNetworks(s string) (networks, error) {
	var ns networks
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		ns = append(ns, p.Masked())
	}
	if len(ns) == 0 {
		return nil, errors.New("no network")
	}
	return ns, nil
}

// contains reports whether ip is in one of ns.
func (ns networks) contains(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range ns {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// checkLiteral refuses a host:port whose host is an IP address outside
// ns; a host name, or what is no host:port, passes (dial checks what it
// resolves to, or fails).
func (ns networks) checkLiteral(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && !ns.contains(ip) {
		return fmt.Errorf("grpc_addr %s is %w", addr, errOutsideNetworks)
	}
	return nil
}

// dial connects to addr (host:port) at the first address it resolves to
// that is inside ns, and refuses one that resolves to none: the check is
// on the address dialed, so a name that re-resolves elsewhere gains
// nothing. It is the coordinator's gRPC context dialer.
func (ns networks) dial(ctx context.Context, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	for _, ip := range ips {
		if ns.contains(ip) {
			return d.DialContext(ctx, "tcp", net.JoinHostPort(ip.Unmap().String(), port))
		}
	}
	return nil, fmt.Errorf("coordinator: dial worker %s: %v %w", addr, ips, errOutsideNetworks)
}
