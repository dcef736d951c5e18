package charttest

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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

var natsGatewayName = natsName + "-gateway"

// TestRegionOffByDefault: with no region (every values set of the
// matrix), the chart renders nothing of regions: no region flag, no
// region-tls volume, no gateway block in the NATS config, no gateway port
// or Service. (A rendering of the defaults before and after the region
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
					if containerPort(c, "gateway") != 0 {
						t.Errorf("%s/%s: a gateway port without a region", name, c.Name)
					}
				}
				if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "region-tls" }) {
					t.Errorf("%s: volume region-tls without a region", name)
				}
			}
			if r.find("Service", natsGatewayName) != nil {
				t.Errorf("Service %s without a region", natsGatewayName)
			}
			if cm, ok := r.find("ConfigMap", natsName).(*corev1.ConfigMap); ok && strings.Contains(cm.Data["nats.conf"], "gateway") {
				t.Errorf("nats.conf has a gateway without a region:\n%s", cm.Data["nats.conf"])
			}
		})
	}
}

// TestRegionCoordinator: a region's coordinator gets --region, the
// advertise URL and the forwarding TLS files, mounted from
// region.tlsSecret (its three keys, nothing else); its other flags pass
// the checks of TestChart. While the coordinator's flag set lacks the
// region flags (package region, built beside this chart) they are taken
// out before that check.
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

			fs, _ := binaries["coordinator"]()
			if fs.Lookup("region") == nil {
				for i := range d.Spec.Template.Spec.Containers {
					cc := &d.Spec.Template.Spec.Containers[i]
					cc.Args = slices.DeleteFunc(cc.Args, func(a string) bool {
						name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
						return slices.Contains(regionFlags, name)
					})
				}
			}
			checkFlags(t, r)
			checkPolicy(t, r)
			pol, _ := policyFile(t, r)
			if !strings.Contains(pol, "chat:") {
				t.Errorf("policy has no tier chat:\n%s", pol)
			}
		})
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

// regionNATS is one region's bundled NATS server config as nats-server
// parses it, its TLS files replaced by test ones.
type regionNATS struct {
	release release
	opts    *server.Options
}

// parseRegionNATS renders file and parses its nats.conf with
// nats-server, the region Secret's files at regionTLSDir replaced by
// pair's and ca's, the passwords by fixed ones.
func parseRegionNATS(t *testing.T, region, file string, pair tlstest.Pair, caFile string) regionNATS {
	t.Helper()
	r := render(t, valuesSet{name: region, file: file})
	cm, ok := r.find("ConfigMap", natsName).(*corev1.ConfigMap)
	if !ok {
		t.Fatalf("no ConfigMap %s", natsName)
	}
	conf := strings.NewReplacer(regionTLSDir+"/tls.crt", pair.CertFile, regionTLSDir+"/tls.key", pair.KeyFile,
		regionTLSDir+"/ca.crt", caFile).Replace(cm.Data["nats.conf"])
	for _, u := range []string{"COORDINATOR", "PREFILL", "DECODE"} {
		t.Setenv("PDSERVE_NATS_"+u+"_PASSWORD", `"pw"`)
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects the config: %v\n%s", err, conf)
	}
	return regionNATS{release: r, opts: opts}
}

// TestRegionGateway: each region's bundled NATS server has a gateway
// named after the region, listening on all interfaces on the port the
// container and the gateway Service expose, requiring and verifying
// certificates of the region CA (the region Secret, mounted), and
// dialing the peers of the values. Two servers with these configs (on
// loopback) form the super-cluster: a message published in us-east
// reaches a subscriber in eu-west. A server whose certificate another CA
// signed is not let in.
func TestRegionGateway(t *testing.T) {
	ca := tlstest.NewCA(t, "regions")
	leaf := tlstest.Leaf{DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	regions := map[string]regionNATS{}
	for region, file := range regionFiles {
		rn := parseRegionNATS(t, region, file, ca.Issue(t, leaf), ca.CertFile)
		regions[region] = rn
		r, gw := rn.release, rn.opts.Gateway
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
			t.Errorf("%s: gateway peers (-values +nats.conf):\n%s", region, diff)
		}
		spec := &r.deployment(t, natsName).Spec.Template.Spec
		c := container(t, spec, "nats")
		if got := containerPort(c, "gateway"); int64(got) != port {
			t.Errorf("%s: NATS container port gateway %d, want %d", region, got, port)
		}
		checkRegionTLSVolume(t, r, region+" nats", spec, c)
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

	east := startRegionNATS(t, regions["us-east"].opts, nil, "")
	west := startRegionNATS(t, regions["eu-west"].opts, east, "us-east")
	if !crosses(t, east, west) {
		t.Fatal("a message published in us-east never reached eu-west")
	}

	// A third server of another CA, naming eu-west as its peer, never
	// joins: the TLS handshake of its gateway connection fails.
	other := tlstest.NewCA(t, "intruder")
	rogue := parseRegionNATS(t, "us-east", regionFiles["us-east"], other.Issue(t, leaf), other.CertFile)
	rogue.opts.Gateway.Name = "rogue"
	errs := &errorLog{}
	r := startRegionNATS(t, rogue.opts, west, "eu-west", errs)
	deadline := time.Now().Add(10 * time.Second)
	for !errs.has("TLS") {
		if time.Now().After(deadline) {
			t.Fatal("the rogue gateway logged no TLS error")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if in := gateways(t, west, true); !slices.Equal(in, []string{"us-east"}) {
		t.Errorf("a gateway with a certificate of another CA joined: eu-west's inbound gateways %v", in)
	}
	if out := gateways(t, r, false); len(out) != 0 {
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

// startRegionNATS starts a server of opts on loopback ports; with peer,
// its gateway dials peer's gateway instead of the values' URLs (which
// name hosts of the example install), else it dials none. With log, the
// server logs its errors there (else nowhere).
func startRegionNATS(t *testing.T, opts *server.Options, peer *server.Server, peerName string, log ...*errorLog) *server.Server {
	t.Helper()
	o := opts.Clone()
	o.Host, o.Port, o.HTTPPort = "127.0.0.1", -1, 0
	o.Gateway.Host, o.Gateway.Port = "127.0.0.1", -1
	o.StoreDir = t.TempDir()
	o.NoLog, o.NoSigs = true, true
	o.ServerName = o.Gateway.Name
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
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("%s: %v", o.Gateway.Name, err)
	}
	l := &errorLog{}
	if len(log) > 0 {
		l = log[0]
	}
	s.SetLogger(l, false, false)
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("%s: not ready: %q", o.Gateway.Name, l.errs)
	}
	return s
}

// crosses reports whether a message published on from reaches a
// subscriber on to, polling for the gateways to connect.
func crosses(t *testing.T, from, to *server.Server) bool {
	t.Helper()
	sub := connect(t, to, "coordinator")
	pub := connect(t, from, "decode")
	s, err := sub.SubscribeSync("pdserve.hb.decode.x")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := pub.Publish("pdserve.hb.decode.x", []byte("hb")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.NextMsg(100 * time.Millisecond); err == nil {
			return true
		}
	}
	return false
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
		{"peer is this region", region + `  gateway: {peers: [{name: us-east, url: "nats://a:7222"}]}
nats: {jetstream: false}`, "is this region"},
		{"peer twice", region + `  gateway: {peers: [{name: eu-west, url: "nats://a:7222"}, {name: eu-west, url: "nats://b:7222"}]}
nats: {jetstream: false}`, "listed twice"},
		{"peers with external NATS", region + `  gateway: {peers: [{name: eu-west, url: "nats://a:7222"}]}
nats: {bundled: false, external: {url: "nats://nats.example.com:4222"}}`, "bundled NATS server only"},
		{"network policies", region + `networkPolicy: {enabled: true}
nats: {jetstream: false}`, "NetworkPolicies do not yet allow"},
		{"JetStream in the bundled NATS", region, "needs nats.jetstream=false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := renderError(t, ch, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render error %v, want one saying %q", err, tc.want)
			}
		})
	}
	// The same without the offending setting renders.
	if err := renderError(t, ch, region+`  gateway: {peers: [{name: eu-west, url: "nats://a:7222"}]}
nats: {jetstream: false}`); err != nil {
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
