package netlab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
)

// Switch is a Linux bridge in a namespace of its own. Namespaces attached
// to it share one /24 of 198.19.0.0/16 (inside 198.18.0.0/15), so that
// every component reaches every other at one address, each attachment a
// veth link that can be shaped or cut on its own.
type Switch struct {
	lab *Lab
	NS  *Namespace
	net netip.Prefix

	mu    sync.Mutex
	ports int
}

// AddSwitch creates a namespace called name holding a bridge. Each Lab
// has at most 255 switches.
func (l *Lab) AddSwitch(ctx context.Context, name string) (*Switch, error) {
	l.mu.Lock()
	idx := l.switches
	l.switches++
	l.mu.Unlock()
	if idx > 254 {
		return nil, fmt.Errorf("netlab: switch %s: out of subnets", name)
	}
	ns, err := l.AddNamespace(ctx, name)
	if err != nil {
		return nil, err
	}
	for _, st := range [][]string{
		{"-n", ns.NetNS, "link", "add", "br0", "type", "bridge"},
		{"-n", ns.NetNS, "link", "set", "br0", "up"},
	} {
		if out, err := runIP(ctx, st...); err != nil {
			return nil, fmt.Errorf("netlab: switch %s: ip %s: %v: %s", name, strings.Join(st, " "), err, out)
		}
	}
	return &Switch{lab: l, NS: ns, net: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(idx), 0}), 24)}, nil
}

// Attach joins n to the switch with a veth pair shaped by sh and gives
// n's end (Link.DevA, Link.AddrA) the next address of the switch's /24;
// the switch's end (DevB) is a bridge port without an address (AddrB is
// the zero Addr).
func (s *Switch) Attach(ctx context.Context, n *Namespace, sh Shape) (*Link, error) {
	if n.lab != s.lab || n == s.NS {
		return nil, fmt.Errorf("netlab: attach %s: not a namespace of this lab", n.Name)
	}
	s.mu.Lock()
	i := s.ports
	s.ports++
	s.mu.Unlock()
	if i > 250 {
		return nil, fmt.Errorf("netlab: attach %s: switch full", n.Name)
	}
	b := s.net.Addr().As4()
	b[3] = byte(i + 1)
	k := &Link{lab: s.lab, A: n, B: s.NS, DevA: "sw0", DevB: fmt.Sprintf("p%d", i), AddrA: netip.AddrFrom4(b)}
	for _, st := range [][]string{
		{"link", "add", k.DevA, "netns", n.NetNS, "type", "veth", "peer", "name", k.DevB, "netns", s.NS.NetNS},
		{"-n", n.NetNS, "addr", "add", netip.PrefixFrom(k.AddrA, 24).String(), "dev", k.DevA},
		{"-n", s.NS.NetNS, "link", "set", k.DevB, "master", "br0"},
		{"-n", n.NetNS, "link", "set", k.DevA, "up"},
		{"-n", s.NS.NetNS, "link", "set", k.DevB, "up"},
	} {
		if out, err := runIP(ctx, st...); err != nil {
			return nil, fmt.Errorf("netlab: attach %s: ip %s: %v: %s", n.Name, strings.Join(st, " "), err, out)
		}
	}
	s.lab.mu.Lock()
	s.lab.links = append(s.lab.links, k)
	s.lab.mu.Unlock()
	if err := k.apply(ctx, sh, "add"); err != nil {
		return nil, err
	}
	return k, nil
}
