package charttest

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"

	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// The two regions of docs/regions.md, as values files.
var regionFiles = map[string]string{
	"us-east": filepath.Join("..", "testdata", "regions", "us-east-values.yaml"),
	"eu-west": filepath.Join("..", "testdata", "regions", "eu-west-values.yaml"),
}

// regionFlags are the coordinator flags the chart sets for a region.
var regionFlags = []string{"region", "region-advertise-url", "region-tls-cert", "region-tls-key", "region-tls-ca"}

const regionTLSDir = "/etc/pdserve/region-tls"

var (
	natsGatewayName   = natsName + "-gateway"
	regionServiceName = coordinatorName + "-region"
)

// TestRegionOffByDefault: with no region (every values set of the
// matrix), the chart renders nothing of regions: no region flag, no
// region-tls volume, no gateway server (its config, its container) nor
// leaf remote in the NATS config, no gateway or forwarding port or
// Service. (A rendering of the defaults before and after the region
// settings differs only in the random secrets the chart generates.)
func TestRegionOffByDefault(t *testing.T) {
	for _, vs := range valuesSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			r := render(t, vs)
			for name, spec := range r.podSpecs() {
				for _, c := range spec.Containers {
					if i := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--region") }); i >= 0 {
						t.Errorf("%s/%s: %s without a region", name, c.Name, c.Args[i])
					}
					for _, port := range []string{"gateway", "region"} {
						if containerPort(c, port) != 0 {
							t.Errorf("%s/%s: a %s port without a region", name, c.Name, port)
						}
					}
				}
				if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "region-tls" }) {
					t.Errorf("%s: volume region-tls without a region", name)
				}
			}
			for _, svc := range []string{natsGatewayName, regionServiceName} {
				if r.find("Service", svc) != nil {
					t.Errorf("Service %s without a region", svc)
				}
			}
			if cm, ok := r.find("ConfigMap", natsName).(*corev1.ConfigMap); ok {
				if c := cm.Data["nats.conf"]; strings.Contains(c, "gateway") || strings.Contains(c, "leafnodes") {
					t.Errorf("nats.conf has a gateway or a leaf remote without a region:\n%s", c)
				}
				if _, ok := cm.Data["gateway.conf"]; ok {
					t.Error("ConfigMap has a gateway.conf without a region")
				}
			}
		})
	}
}

// TestRegionCoordinator: a region's coordinator gets --region, the
// advertise URL and the forwarding TLS files, mounted from
// region.tlsSecret (its three keys, nothing else); its flags pass the
// checks of TestChart, the coordinator's validation included (a sample
// certificate in the region Secret).
func TestRegionCoordinator(t *testing.T) {
	for region, file := range regionFiles {
		t.Run(region, func(t *testing.T) {
			r := render(t, valuesSet{name: region, file: file})
			d := r.deployment(t, coordinatorName)
			spec := &d.Spec.Template.Spec
			c := container(t, spec, "coordinator")
			got := map[string]string{}
			for _, a := range c.Args {
				name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if slices.Contains(regionFlags, name) {
					got[name] = value
				}
			}
			want := map[string]string{
				"region":               region,
				"region-advertise-url": r.value("region.advertiseURL").(string),
				"region-tls-cert":      regionTLSDir + "/tls.crt",
				"region-tls-key":       regionTLSDir + "/tls.key",
				"region-tls-ca":        regionTLSDir + "/ca.crt",
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("coordinator region flags (-want +got):\n%s", diff)
			}
			checkRegionTLSVolume(t, r, "coordinator", spec, c)
			checkRegionService(t, r, c)

			checkFlags(t, r)
			checkPolicy(t, r)
			pol, _ := policyFile(t, r)
			if !strings.Contains(pol, "chat:") {
				t.Errorf("policy has no tier chat:\n%s", pol)
			}
		})
	}
}

// checkRegionService: the coordinator container c declares port region,
// the advertise URL's port (the one the coordinator binds for forwarded
// requests), and Service regionServiceName, of region.service's type and
// annotations, selects the coordinator's pods (as its API Service does)
// and exposes that port, the one the other regions dial.
func checkRegionService(t *testing.T, r release, c corev1.Container) {
	t.Helper()
	u, err := url.Parse(r.value("region.advertiseURL").(string))
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("advertise URL %s: port: %v", u, err)
	}
	if got := containerPort(c, "region"); got != int32(port) {
		t.Errorf("coordinator container port region %d, want the advertise URL's %d", got, port)
	}
	svc, ok := r.find("Service", regionServiceName).(*corev1.Service)
	if !ok {
		t.Fatalf("no Service %s", regionServiceName)
	}
	api, ok := r.find("Service", coordinatorName).(*corev1.Service)
	if !ok {
		t.Fatalf("no Service %s", coordinatorName)
	}
	if diff := cmp.Diff(api.Spec.Selector, svc.Spec.Selector); diff != "" {
		t.Errorf("Service %s selects other pods than %s (-api +region):\n%s", regionServiceName, coordinatorName, diff)
	}
	if string(svc.Spec.Type) != r.value("region.service.type") {
		t.Errorf("Service %s type %s, want region.service.type %v", regionServiceName, svc.Spec.Type, r.value("region.service.type"))
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != int32(port) || svc.Spec.Ports[0].TargetPort.StrVal != "region" {
		t.Errorf("Service %s ports %+v, want one: %d to container port region", regionServiceName, svc.Spec.Ports, port)
	}
	want, _ := r.value("region.service.annotations").(map[string]any)
	got := map[string]any{}
	for k, v := range svc.Annotations {
		got[k] = v
	}
	if len(want) == 0 {
		want = map[string]any{}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Service %s annotations (-values +got):\n%s", regionServiceName, diff)
	}
}

// checkRegionTLSVolume: c mounts the volume region-tls read-only at
// regionTLSDir, and it holds the keys tls.crt, tls.key and ca.crt of
// region.tlsSecret.
func checkRegionTLSVolume(t *testing.T, r release, where string, spec *corev1.PodSpec, c corev1.Container) {
	t.Helper()
	i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "region-tls" })
	if i < 0 || c.VolumeMounts[i].MountPath != regionTLSDir || !c.VolumeMounts[i].ReadOnly {
		t.Errorf("%s: no read-only mount of region-tls at %s: %+v", where, regionTLSDir, c.VolumeMounts)
	}
	j := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "region-tls" })
	if j < 0 || spec.Volumes[j].Secret == nil {
		t.Fatalf("%s: no Secret volume region-tls", where)
	}
	s := spec.Volumes[j].Secret
	if s.SecretName != r.value("region.tlsSecret") {
		t.Errorf("%s: region-tls from Secret %s, want region.tlsSecret %v", where, s.SecretName, r.value("region.tlsSecret"))
	}
	want := []corev1.KeyToPath{{Key: "tls.crt", Path: "tls.crt"}, {Key: "tls.key", Path: "tls.key"}, {Key: "ca.crt", Path: "ca.crt"}}
	if diff := cmp.Diff(want, s.Items); diff != "" {
		t.Errorf("%s: keys of the region Secret (-want +got):\n%s", where, diff)
	}
}

// regionNATS is one region's NATS pod as nats-server parses its configs,
// the TLS files replaced by test ones: the bundled server (nats.conf)
// and the region's gateway server (gateway.conf).
type regionNATS struct {
	release release
	opts    *server.Options // the bundled server
	gw      *server.Options // the gateway server
}

// parseRegionNATS renders file and parses its nats.conf and gateway.conf
// with nats-server, the region Secret's files at regionTLSDir replaced by
// pair's and ca's, the passwords by fixed ones.
func parseRegionNATS(t *testing.T, region, file string, pair tlstest.Pair, caFile string) regionNATS {
	t.Helper()
	r := render(t, valuesSet{name: region, file: file})
	cm, ok := r.find("ConfigMap", natsName).(*corev1.ConfigMap)
	if !ok {
		t.Fatalf("no ConfigMap %s", natsName)
	}
	files := strings.NewReplacer(regionTLSDir+"/tls.crt", pair.CertFile, regionTLSDir+"/tls.key", pair.KeyFile,
		regionTLSDir+"/ca.crt", caFile)
	for _, u := range []string{"COORDINATOR", "PREFILL", "DECODE"} {
		t.Setenv("PDSERVE_NATS_"+u+"_PASSWORD", `"pw"`)
	}
	parse := func(key string) *server.Options {
		conf, ok := cm.Data[key]
		if !ok {
			t.Fatalf("ConfigMap %s has no %s", natsName, key)
		}
		conf = files.Replace(conf)
		path := filepath.Join(t.TempDir(), key)
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("nats-server rejects %s: %v\n%s", key, err, conf)
		}
		return opts
	}
	return regionNATS{release: r, opts: parse("nats.conf"), gw: parse("gateway.conf")}
}

// regionLocal are the subjects that never leave a region (those of
// pkg/control's leaf remote).
var regionLocal = []string{"pdserve.hb.>", "pdserve.cmd.>", "pdserve.kv.>", "pdserve.plan", "_INBOX.>", "$JS.>", "$KV.>", "$SYS.>"}

// TestRegionGateway: each region's NATS pod runs the bundled server,
// with JetStream and without a gateway, and a second server, the
// region's gateway (container gateway), as pkg/control.StartGateway
// configures it: a gateway named after the region, listening on all
// interfaces on the port the container and the gateway Service expose,
// requiring and verifying certificates of the region CA (the region
// Secret, mounted), dialing the peers of the values; a leafnode listener
// on loopback, which the bundled server dials with the region's own
// subjects denied both ways. Two regions' servers started from these
// configs (on loopback) federate: a region message published in us-east
// reaches a coordinator in eu-west, while a decode worker's heartbeat
// and a coordinator's command never leave their region; JetStream
// answers in each region. A gateway whose certificate another CA signed
// is not let in.
func TestRegionGateway(t *testing.T) {
	ca := tlstest.NewCA(t, "regions")
	leaf := tlstest.Leaf{DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	regions := map[string]regionNATS{}
	for region, file := range regionFiles {
		rn := parseRegionNATS(t, region, file, ca.Issue(t, leaf), ca.CertFile)
		regions[region] = rn
		r, gw := rn.release, rn.gw.Gateway
		if gw.Name != region {
			t.Errorf("%s: gateway name %q", region, gw.Name)
		}
		port := r.intValue(t, "region.gateway.port")
		if gw.Host != "0.0.0.0" || int64(gw.Port) != port {
			t.Errorf("%s: gateway listens on %s:%d, want 0.0.0.0:%d", region, gw.Host, gw.Port, port)
		}
		if gw.TLSConfig == nil || gw.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
			t.Errorf("%s: gateway does not require client certificates: %+v", region, gw.TLSConfig)
		}
		var peers []string
		for _, g := range gw.Gateways {
			for _, u := range g.URLs {
				peers = append(peers, g.Name+"="+u.String())
			}
		}
		var want []string
		for _, p := range r.value("region.gateway.peers").([]any) {
			p := p.(map[string]any)
			want = append(want, fmt.Sprintf("%s=%s", p["name"], p["url"]))
		}
		if diff := cmp.Diff(want, peers); diff != "" {
			t.Errorf("%s: gateway peers (-values +gateway.conf):\n%s", region, diff)
		}
		if rn.gw.Host != "127.0.0.1" || rn.gw.LeafNode.Host != "127.0.0.1" {
			t.Errorf("%s: the gateway server's clients (%s) and leaf nodes (%s) not on loopback only", region, rn.gw.Host, rn.gw.LeafNode.Host)
		}
		if rn.gw.JetStream {
			t.Errorf("%s: JetStream on the gateway server", region)
		}

		// The bundled server: JetStream, no gateway, one leaf remote to
		// the gateway server's loopback listener, the region's own
		// subjects denied.
		o := rn.opts
		if !o.JetStream {
			t.Errorf("%s: JetStream off in the bundled server", region)
		}
		if o.Gateway.Name != "" || o.Gateway.Port != 0 {
			t.Errorf("%s: the bundled server has a gateway %q on port %d", region, o.Gateway.Name, o.Gateway.Port)
		}
		if len(o.LeafNode.Remotes) != 1 || len(o.LeafNode.Remotes[0].URLs) != 1 {
			t.Fatalf("%s: bundled server's leaf remotes %+v, want one", region, o.LeafNode.Remotes)
		}
		rem := o.LeafNode.Remotes[0]
		if u := rem.URLs[0]; u.Hostname() != "127.0.0.1" || u.Port() != strconv.Itoa(rn.gw.LeafNode.Port) {
			t.Errorf("%s: leaf remote %s, want the gateway server's listener 127.0.0.1:%d", region, u, rn.gw.LeafNode.Port)
		}
		if !slices.Equal(rem.DenyImports, regionLocal) || !slices.Equal(rem.DenyExports, regionLocal) {
			t.Errorf("%s: leaf remote denies imports %v, exports %v; want %v both", region, rem.DenyImports, rem.DenyExports, regionLocal)
		}

		spec := &r.deployment(t, natsName).Spec.Template.Spec
		if containerPort(container(t, spec, "nats"), "gateway") != 0 {
			t.Errorf("%s: the bundled server's container exposes a gateway port", region)
		}
		c := container(t, spec, "gateway")
		if got := containerPort(c, "gateway"); int64(got) != port {
			t.Errorf("%s: gateway container port gateway %d, want %d", region, got, port)
		}
		if !slices.Equal(c.Args, []string{"--config", "/etc/nats/gateway.conf"}) {
			t.Errorf("%s: gateway container args %q", region, c.Args)
		}
		checkRegionTLSVolume(t, r, region+" gateway", spec, c)
		svc, ok := r.find("Service", natsGatewayName).(*corev1.Service)
		if !ok {
			t.Fatalf("%s: no Service %s", region, natsGatewayName)
		}
		if len(svc.Spec.Ports) != 1 || int64(svc.Spec.Ports[0].Port) != port || svc.Spec.Ports[0].TargetPort.String() != "gateway" {
			t.Errorf("%s: Service %s ports %+v, want %d → gateway", region, natsGatewayName, svc.Spec.Ports, port)
		}
		if string(svc.Spec.Type) != r.value("region.gateway.service.type") {
			t.Errorf("%s: Service %s type %s, want %v", region, natsGatewayName, svc.Spec.Type, r.value("region.gateway.service.type"))
		}
		if diff := cmp.Diff(r.deployment(t, natsName).Spec.Selector.MatchLabels, svc.Spec.Selector); diff != "" {
			t.Errorf("%s: Service %s selects other pods than NATS (-nats +service):\n%s", region, natsGatewayName, diff)
		}
	}

	eastGW := startGatewayNATS(t, regions["us-east"].gw, nil, "")
	westGW := startGatewayNATS(t, regions["eu-west"].gw, eastGW.s, "us-east")
	east := startRegionNATS(t, regions["us-east"].opts, eastGW)
	west := startRegionNATS(t, regions["eu-west"].opts, westGW)
	for name, s := range map[string]*server.Server{"us-east": east, "eu-west": west} {
		js, err := connect(t, s, "coordinator").JetStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.AccountInfo(); err != nil {
			t.Errorf("%s: JetStream: %v", name, err)
		}
	}

	// A region message crosses; a heartbeat published before it does not
	// (it would arrive first), though it reaches its own region.
	eastCoord, westCoord := connect(t, east, "coordinator"), connect(t, west, "coordinator")
	eastDecode, westDecode := connect(t, east, "decode"), connect(t, west, "decode")
	toWest := subscribe(t, westCoord, "pdserve.region.x")
	hbThere := subscribe(t, westCoord, "pdserve.hb.>")
	hbHere := subscribe(t, eastCoord, "pdserve.hb.>")
	if !crosses(func() {
		publish(t, eastDecode, "pdserve.hb.decode.x")
		publish(t, eastCoord, "pdserve.region.x")
	}, toWest) {
		t.Fatal("a region message published in us-east never reached eu-west")
	}
	flush(t, westCoord)
	flush(t, eastCoord)
	if n, _, _ := hbThere.Pending(); n != 0 {
		t.Errorf("%d heartbeats of us-east's decode worker reached eu-west's coordinator", n)
	}
	if n, _, _ := hbHere.Pending(); n == 0 {
		t.Error("us-east's coordinator got no heartbeat of its own decode worker")
	}

	// The same for a command, the other way.
	toEast := subscribe(t, eastCoord, "pdserve.region.x")
	cmdThere := subscribe(t, eastDecode, "pdserve.cmd.decode.*")
	cmdHere := subscribe(t, westDecode, "pdserve.cmd.decode.*")
	if !crosses(func() {
		publish(t, westCoord, "pdserve.cmd.decode.x")
		publish(t, westCoord, "pdserve.region.x")
	}, toEast) {
		t.Fatal("a region message published in eu-west never reached us-east")
	}
	flush(t, eastDecode)
	flush(t, westDecode)
	if n, _, _ := cmdThere.Pending(); n != 0 {
		t.Errorf("%d commands of eu-west's coordinator reached us-east's decode worker", n)
	}
	if n, _, _ := cmdHere.Pending(); n == 0 {
		t.Error("eu-west's decode worker got no command of its own coordinator")
	}

	// A third gateway server of another CA, naming eu-west as its peer,
	// never joins: the TLS handshake of its gateway connection fails.
	other := tlstest.NewCA(t, "intruder")
	rogue := parseRegionNATS(t, "us-east", regionFiles["us-east"], other.Issue(t, leaf), other.CertFile)
	rogue.gw.Gateway.Name = "rogue"
	errs := &errorLog{}
	r := startGatewayNATS(t, rogue.gw, westGW.s, "eu-west", errs)
	deadline := time.Now().Add(10 * time.Second)
	for !errs.has("TLS") {
		if time.Now().After(deadline) {
			t.Fatal("the rogue gateway logged no TLS error")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if in := gateways(t, westGW.s, true); !slices.Equal(in, []string{"us-east"}) {
		t.Errorf("a gateway with a certificate of another CA joined: eu-west's inbound gateways %v", in)
	}
	if out := gateways(t, r.s, false); len(out) != 0 {
		t.Errorf("the rogue gateway connected to %v", out)
	}
}

// gateways returns the names of s's inbound (or outbound) gateways with a
// connection, sorted.
func gateways(t *testing.T, s *server.Server, inbound bool) []string {
	t.Helper()
	z, err := s.Gatewayz(&server.GatewayzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	if inbound {
		for name, conns := range z.InboundGateways {
			if len(conns) > 0 {
				names = append(names, name)
			}
		}
	} else {
		for name, g := range z.OutboundGateways {
			if g != nil && g.Connection != nil {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// errorLog is a nats-server logger that keeps the errors.
type errorLog struct {
	mu   sync.Mutex
	errs []string
}

func (l *errorLog) Noticef(string, ...any)         {}
func (l *errorLog) Warnf(string, ...any)           {}
func (l *errorLog) Fatalf(format string, v ...any) { l.Errorf(format, v...) }
func (l *errorLog) Debugf(string, ...any)          {}
func (l *errorLog) Tracef(string, ...any)          {}
func (l *errorLog) Errorf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Sprintf(format, v...))
}

// has reports whether an error logged so far contains s.
func (l *errorLog) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.errs, func(e string) bool { return strings.Contains(e, s) })
}

// gatewayNATS is a started gateway server and the loopback port of its
// leafnode listener.
type gatewayNATS struct {
	s        *server.Server
	leafPort int
}

// startGatewayNATS starts a gateway server of opts on loopback ports;
// with peer, its gateway dials peer's gateway instead of the values' URLs
// (which name hosts of the example install), else it dials none. With
// log, the server logs its errors there (else nowhere).
func startGatewayNATS(t *testing.T, opts *server.Options, peer *server.Server, peerName string, log ...*errorLog) gatewayNATS {
	t.Helper()
	o := opts.Clone()
	o.Host, o.Port, o.HTTPPort = "127.0.0.1", -1, 0
	o.Gateway.Host, o.Gateway.Port = "127.0.0.1", -1
	// nats-server does not tell the port of a leafnode listener it picked.
	o.LeafNode.Port = freePort(t)
	o.NoLog, o.NoSigs = true, true
	o.Gateway.Gateways = nil
	if peer != nil {
		u, err := url.Parse(fmt.Sprintf("nats://localhost:%d", peer.GatewayAddr().Port))
		if err != nil {
			t.Fatal(err)
		}
		remote := &server.RemoteGatewayOpts{Name: peerName, URLs: []*url.URL{u}}
		for _, g := range opts.Gateway.Gateways {
			if g.Name == peerName {
				remote.TLSConfig = g.TLSConfig
			}
		}
		o.Gateway.Gateways = []*server.RemoteGatewayOpts{remote}
	}
	return gatewayNATS{s: startNATS(t, o, log...), leafPort: o.LeafNode.Port}
}

// startRegionNATS starts a bundled server of opts on a loopback port,
// its leaf remote rewritten to gw's listener, and waits for the leaf
// connection.
func startRegionNATS(t *testing.T, opts *server.Options, gw gatewayNATS) *server.Server {
	t.Helper()
	o := opts.Clone()
	o.Host, o.Port, o.HTTPPort = "127.0.0.1", -1, 0
	o.StoreDir = t.TempDir()
	o.NoLog, o.NoSigs = true, true
	for _, r := range o.LeafNode.Remotes {
		for _, u := range r.URLs {
			u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(gw.leafPort))
		}
	}
	s := startNATS(t, o)
	deadline := time.Now().Add(10 * time.Second)
	for s.NumLeafNodes() != 1 || gw.s.NumLeafNodes() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no leaf connection to the gateway server", o.ServerName)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// startNATS starts a server of o, logging its errors to log (else
// nowhere), stopped at the test's end.
func startNATS(t *testing.T, o *server.Options, log ...*errorLog) *server.Server {
	t.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("%s: %v", o.ServerName, err)
	}
	l := &errorLog{}
	if len(log) > 0 {
		l = log[0]
	}
	s.SetLogger(l, false, false)
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("%s: not ready: %q", o.ServerName, l.errs)
	}
	return s
}

// freePort returns a port free on 127.0.0.1 now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// crosses reports whether send, repeated, gets a message to sub, polling
// for interest to propagate across the leaf nodes and gateways.
func crosses(send func(), sub *nats.Subscription) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		send()
		if _, err := sub.NextMsg(100 * time.Millisecond); err == nil {
			return true
		}
	}
	return false
}

// subscribe subscribes nc to subject and flushes the subscription.
func subscribe(t *testing.T, nc *nats.Conn, subject string) *nats.Subscription {
	t.Helper()
	s, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	flush(t, nc)
	return s
}

// publish publishes to subject on nc and flushes: when it returns, the
// server has processed the message.
func publish(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	if err := nc.Publish(subject, []byte(subject)); err != nil {
		t.Fatal(err)
	}
	flush(t, nc)
}

// flush makes a round trip to nc's server: every message the server sent
// nc before has been read.
func flush(t *testing.T, nc *nats.Conn) {
	t.Helper()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// connect logs into s as user (password "pw").
func connect(t *testing.T, s *server.Server, user string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, "pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestRegionRefused: region settings the chart cannot honour fail to
// render, saying why.
func TestRegionRefused(t *testing.T) {
	ch := loadChart(t)
	const region = `
region:
  name: us-east
  advertiseURL: https://pdserve.us-east.example.com:8443
  tlsSecret: pdserve-region-tls
`
	for _, tc := range []struct{ name, values, want string }{
		{"peer is this region", region + `  gateway: {peers: [{name: us-east, url: "nats://a:7222"}]}`, "is this region"},
		{"peer twice", region + `  gateway: {peers: [{name: eu-west, url: "nats://a:7222"}, {name: eu-west, url: "nats://b:7222"}]}`, "listed twice"},
		{"peers with external NATS", region + `  gateway: {peers: [{name: eu-west, url: "nats://a:7222"}]}
nats: {bundled: false, external: {url: "nats://nats.example.com:4222"}}`, "bundled NATS server only"},
		{"network policies", region + `networkPolicy: {enabled: true}`, "NetworkPolicies do not yet allow"},
		{"forwarding on the API's port", strings.Replace(region, ":8443", ":8080", 1), "is coordinator.httpPort"},
		{"advertise URL without a port", strings.Replace(region, ":8443", "", 1), "advertiseURL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := renderError(t, ch, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render error %v, want one saying %q", err, tc.want)
			}
		})
	}
	// The same without the offending setting renders, JetStream on (the
	// default).
	if err := renderError(t, ch, region+`  gateway: {peers: [{name: eu-west, url: "nats://a:7222"}]}`); err != nil {
		t.Errorf("a region with one peer: %v", err)
	}
}

// TestTiersRefuseKubernetesActuator: the planner's Kubernetes actuator
// scales one pair of Deployments, which the coordinator refuses with
// tiers (each model planned apart): the chart refuses it at render.
func TestTiersRefuseKubernetesActuator(t *testing.T) {
	ch := loadChart(t)
	const tiers = "coordinator:\n  policy:\n    tiers:\n      chat: {models: [llama-3-8b, llama-3-70b]}\n"
	err := renderError(t, ch, tiers+"  planner: {actuator: kubernetes}\n")
	if err == nil || !strings.Contains(err.Error(), "use actuator log") {
		t.Errorf("render error %v, want one saying to use actuator log", err)
	}
	if err := renderError(t, ch, tiers); err != nil {
		t.Errorf("tiers with the default actuator: %v", err)
	}
}
