package charttest

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/yaml"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
	"github.com/pdserve/pdserve/pkg/planner/actuator"
)

// certificate mirrors the fields of a cert-manager.io/v1 Certificate that
// the chart uses (cert-manager's types are not a dependency), so that
// strict decoding catches a misspelt or misplaced field.
type certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName  string `json:"secretName"`
		Duration    string `json:"duration,omitempty"`
		RenewBefore string `json:"renewBefore,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		DNSNames  []string `json:"dnsNames,omitempty"`
		URIs      []string `json:"uris,omitempty"`
		Usages    []string `json:"usages,omitempty"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind,omitempty"`
			Group string `json:"group,omitempty"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// sans returns a Certificate's subject alternative names.
func (c *certificate) sans() []string { return append(slices.Clone(c.Spec.DNSNames), c.Spec.URIs...) }

// containerRole maps a pdserve container of the chart to its role.
var containerRole = map[string]string{"coordinator": "coordinator", "prefill-worker": "prefill", "decode-worker": "decode"}

// grpcTokenDir is where the chart mounts the gRPC token files.
const grpcTokenDir = "/etc/pdserve/grpc"

// generatedTokenSecret is the Secret the chart generates the tokens into.
var generatedTokenSecret = releaseName + "-pdserve-grpc-token"

// wantTokenFlags lists, per role, the token flags and the key of the token
// Secret each names: a component holds the token it sends and only the
// digest of one it checks, so no worker can act as the coordinator.
var wantTokenFlags = map[string]map[string]string{
	"coordinator": {"grpc-token-file": "coordinator.token"},
	"prefill":     {"grpc-token-file": "coordinator.sha256", "grpc-prefill-token-file": "prefill.token"},
	"decode":      {"grpc-token-file": "coordinator.sha256", "grpc-prefill-token-file": "prefill.sha256"},
	// Beside the elastic pool a decode worker holds the prefill token: it
	// sends it on its pull of a sequence migrated off an elastic worker.
	"decode beside elastic": {"grpc-token-file": "coordinator.sha256", "grpc-prefill-token-file": "prefill.token"},
}

// argMap returns a container's --name=value args by name.
func argMap(args []string) map[string]string {
	out := map[string]string{}
	for _, a := range args {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		out[name] = value
	}
	return out
}

// providedSecrets lists the Secrets the release's pods mount that the
// release does not create: those the values name as the user's, and those
// cert-manager fills from the release's Certificates.
func (r release) providedSecrets() []string {
	var out []string
	for _, path := range []string{"grpc.tokenSecret", "tls.roleSecrets.coordinator", "tls.roleSecrets.prefill", "tls.roleSecrets.decode", "tls.roleSecrets.elastic",
		"auth.apiKeysSecret", "auth.metricsTokenSecret", "region.tlsSecret"} {
		if s, _ := r.value(path).(string); s != "" {
			out = append(out, s)
		}
	}
	for _, o := range r.all("Certificate") {
		out = append(out, o.obj.(*certificate).Spec.SecretName)
	}
	return out
}

// providedSecret returns sample data of a Secret that the user or
// cert-manager provides, as mounted into container (a container name of
// the chart), or nil for a Secret of the release: for a Certificate's
// Secret a certificate issued as the Certificate asks (its names and
// extended key usages); for tls.roleSecrets the names and usages the
// values document for the role; for tls.existingSecret one certificate
// naming tls.serverName for both uses; for grpc.tokenSecret the four keys
// it documents; for auth.apiKeysSecret a key file of one key, for
// auth.metricsTokenSecret a token; for region.tlsSecret a certificate
// for both uses naming the host of region.advertiseURL.
func (r release) providedSecret(t *testing.T, name, container string) map[string]string {
	t.Helper()
	role := containerRole[container]
	if s, _ := r.value("region.tlsSecret").(string); s != "" && s == name {
		u, err := url.Parse(fmt.Sprint(r.value("region.advertiseURL")))
		if err != nil {
			t.Fatalf("region.advertiseURL: %v", err)
		}
		return sampleTLSData(t, tlstest.Leaf{DNSNames: []string{u.Hostname()},
			Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
	}
	if tlsOn, _ := r.value("tls.enabled").(bool); tlsOn {
		for _, o := range r.all("Certificate") {
			if c := o.obj.(*certificate); c.Spec.SecretName == name {
				return sampleTLSData(t, certLeaf(t, c))
			}
		}
		serverName := fmt.Sprint(r.value("tls.serverName"))
		if s, _ := r.value("tls.roleSecrets." + role).(string); s != "" && s == name {
			l := tlstest.Leaf{Usages: roleUsages(role)}
			if role != "coordinator" {
				l.DNSNames = []string{serverName}
			}
			if id, _ := r.value("tls.identities." + role).(string); id != "" {
				addSAN(t, &l, id)
			}
			return sampleTLSData(t, l)
		}
		if name == r.value("tls.existingSecret") {
			return sampleTLSSecret(t, serverName)
		}
	}
	if on, _ := r.value("grpc.tokens.enabled").(bool); on && name == r.value("grpc.tokenSecret") {
		return sampleTokenSecret()
	}
	switch name {
	case r.value("auth.apiKeysSecret"):
		return map[string]string{"api-keys": digest("sample-api-key-0123456789abcdef") + " name=sample\n"}
	case r.value("auth.metricsTokenSecret"):
		return map[string]string{"metrics-token": "sample-metrics-token-0123456789abcdef"}
	}
	return nil
}

// roleUsages are the extended key usages a role's certificate needs:
// workers serve, the coordinator and prefill workers dial.
func roleUsages(role string) []x509.ExtKeyUsage {
	switch role {
	case "coordinator":
		return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	case "prefill":
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	default:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
}

// addSAN adds an identity to a leaf: a URI when it has a scheme, else a
// DNS name.
func addSAN(t *testing.T, l *tlstest.Leaf, id string) {
	if strings.Contains(id, "://") {
		l.URIs = append(l.URIs, tlstest.MustURL(t, id))
	} else {
		l.DNSNames = append(l.DNSNames, id)
	}
}

// certLeaf describes the certificate cert-manager would issue for c.
func certLeaf(t *testing.T, c *certificate) tlstest.Leaf {
	t.Helper()
	l := tlstest.Leaf{DNSNames: slices.Clone(c.Spec.DNSNames), Usages: []x509.ExtKeyUsage{}}
	for _, u := range c.Spec.URIs {
		l.URIs = append(l.URIs, tlstest.MustURL(t, u))
	}
	for _, u := range c.Spec.Usages {
		switch u {
		case "server auth":
			l.Usages = append(l.Usages, x509.ExtKeyUsageServerAuth)
		case "client auth":
			l.Usages = append(l.Usages, x509.ExtKeyUsageClientAuth)
		}
	}
	return l
}

// sampleTLSData returns the data of a kubernetes.io/tls Secret as
// cert-manager writes it (tls.crt, tls.key, ca.crt) for a certificate l
// describes.
func sampleTLSData(t *testing.T, l tlstest.Leaf) map[string]string {
	t.Helper()
	ca := tlstest.NewCA(t, "sample CA")
	leaf := ca.Issue(t, l)
	data := map[string]string{}
	for key, path := range map[string]string{"tls.crt": leaf.CertFile, "tls.key": leaf.KeyFile, "ca.crt": ca.CertFile} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		data[key] = string(b)
	}
	return data
}

// Sample tokens of a grpc.tokenSecret, as values.yaml shows how to make.
const (
	sampleCoordinatorToken = "0123456789abcdef0123456789abcdef-coordinator"
	samplePrefillToken     = "fedcba9876543210fedcba9876543210-prefill"
)

func digest(token string) string {
	d := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(d[:])
}

// sampleTokenSecret returns the data of a grpc.tokenSecret.
func sampleTokenSecret() map[string]string {
	return map[string]string{
		"coordinator.token": sampleCoordinatorToken, "coordinator.sha256": digest(sampleCoordinatorToken),
		"prefill.token": samplePrefillToken, "prefill.sha256": digest(samplePrefillToken),
	}
}

// checkGRPCTokens: with grpc.tokens.enabled every pdserve container gets
// exactly its role's token flags (wantTokenFlags), each naming a file of
// the token volume, which holds only that role's keys of the token Secret
// (the generated one, whose digests match its tokens, or
// grpc.tokenSecret); without, no token flag, volume or Secret.
func checkGRPCTokens(t *testing.T, r release) {
	enabled, _ := r.value("grpc.tokens.enabled").(bool)
	secretName, _ := r.value("grpc.tokenSecret").(string)
	s, generated := r.find("Secret", generatedTokenSecret).(*corev1.Secret)
	if want := enabled && secretName == ""; generated != want {
		t.Errorf("Secret %s rendered: %v, want %v", generatedTokenSecret, generated, want)
	}
	if generated {
		checkTokenSecret(t, s.Data)
	}
	if secretName == "" {
		secretName = generatedTokenSecret
	}
	for _, p := range pools(r) {
		spec := &r.deployment(t, p.deployment).Spec.Template.Spec
		c := container(t, spec, p.container)
		role := containerRole[p.container]
		if e, _ := r.value("elastic.enabled").(bool); e && role == "decode" {
			role = "decode beside elastic"
		}
		got := map[string]string{}
		for name, v := range argMap(c.Args) {
			if strings.HasSuffix(name, "-token-file") && strings.HasPrefix(name, "grpc-") {
				got[name] = v
			}
		}
		want := map[string]string{}
		var wantItems []corev1.KeyToPath
		if enabled {
			for f, key := range wantTokenFlags[role] {
				want[f] = grpcTokenDir + "/" + key
				wantItems = append(wantItems, corev1.KeyToPath{Key: key, Path: key})
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: gRPC token flags (-want +got):\n%s", p.deployment, diff)
		}
		vol, mount := findVolume(spec, "grpc-token"), findMount(c, "grpc-token")
		if !enabled {
			if vol != nil || mount != nil {
				t.Errorf("%s: token volume or mount without grpc.tokens.enabled", p.deployment)
			}
			continue
		}
		if vol == nil || vol.Secret == nil || mount == nil {
			t.Errorf("%s: no token Secret volume and mount", p.deployment)
			continue
		}
		if vol.Secret.SecretName != secretName {
			t.Errorf("%s: token volume from Secret %s, want %s", p.deployment, vol.Secret.SecretName, secretName)
		}
		sortItems := func(items []corev1.KeyToPath) []corev1.KeyToPath {
			items = slices.Clone(items)
			sort.Slice(items, func(i, j int) bool { return items[i].Key < items[j].Key })
			return items
		}
		if diff := cmp.Diff(sortItems(wantItems), sortItems(vol.Secret.Items)); diff != "" {
			t.Errorf("%s: token volume items (-want +got):\n%s", p.deployment, diff)
		}
		if mount.MountPath != grpcTokenDir || !mount.ReadOnly {
			t.Errorf("%s: token mount %+v, want read-only at %s", p.deployment, mount, grpcTokenDir)
		}
	}
}

// checkTokenSecret: the generated Secret holds two different tokens that
// the workers accept (printable, long enough) and their digests.
func checkTokenSecret(t *testing.T, data map[string][]byte) {
	t.Helper()
	keys := slices.Sorted(maps.Keys(data))
	if diff := cmp.Diff([]string{"coordinator.sha256", "coordinator.token", "prefill.sha256", "prefill.token"}, keys); diff != "" {
		t.Errorf("token Secret keys (-want +got):\n%s", diff)
	}
	for _, role := range []string{"coordinator", "prefill"} {
		tok := string(data[role+".token"])
		if len(tok) < grpcauth.MinTokenBytes || strings.ContainsFunc(tok, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			t.Errorf("%s token: %d bytes or not printable", role, len(tok))
		}
		if got := string(data[role+".sha256"]); got != digest(tok) {
			t.Errorf("%s.sha256 = %q, want the token's digest", role, got)
		}
	}
	if string(data["coordinator.token"]) == string(data["prefill.token"]) {
		t.Error("the coordinator and the prefill workers share one token")
	}
}

// checkCertificates: with tls.certManager.enabled (or the chart's
// generated certificates, checked further by TestGeneratedTLS) there is one
// Certificate per role of the release, filling the Secret its pods mount,
// from the configured issuer; the workers' certificates name
// tls.serverName and allow serving, the coordinator's only client
// authentication; and the identities the workers allow
// (--tls-allow-coordinator, --tls-allow-prefill) are names of that role's
// certificate and of no other's. With a shared certificate of the user's
// and no identities the workers allow any certificate (no --tls-allow-*).
func checkCertificates(t *testing.T, r release) {
	tlsOn, _ := r.value("tls.enabled").(bool)
	cm, _ := r.value("tls.certManager.enabled").(bool)
	certs := map[string]*certificate{}
	for _, o := range r.all("Certificate") {
		certs[o.name] = o.obj.(*certificate)
	}
	byRole := map[string]*certificate{}
	for _, p := range pools(r) {
		role := containerRole[p.container]
		name := releaseName + "-pdserve-" + role
		c, ok := certs[name]
		if !(tlsOn && cm) {
			continue
		}
		if !ok {
			t.Errorf("no Certificate %s", name)
			continue
		}
		byRole[role] = c
		delete(certs, name)
		spec := &r.deployment(t, p.deployment).Spec.Template.Spec
		if v := findVolume(spec, "tls"); v == nil || v.Secret == nil || v.Secret.SecretName != c.Spec.SecretName {
			t.Errorf("%s: tls volume %+v, want Secret %s of Certificate %s", p.deployment, v, c.Spec.SecretName, name)
		}
		serverName := fmt.Sprint(r.value("tls.serverName"))
		wantUsages := map[string][]string{"coordinator": {"client auth"}, "prefill": {"server auth", "client auth"}, "decode": {"server auth"}}[role]
		var gotUsages []string
		for _, u := range c.Spec.Usages {
			if strings.HasSuffix(u, " auth") {
				gotUsages = append(gotUsages, u)
			}
		}
		if diff := cmp.Diff(wantUsages, gotUsages); diff != "" {
			t.Errorf("Certificate %s extended usages (-want +got):\n%s", name, diff)
		}
		if got := slices.Contains(c.Spec.DNSNames, serverName); got != (role != "coordinator") {
			t.Errorf("Certificate %s names tls.serverName %s: %v, want %v", name, serverName, got, role != "coordinator")
		}
		ref := c.Spec.IssuerRef
		if ref.Name != r.value("tls.certManager.issuerRef.name") || ref.Kind != r.value("tls.certManager.issuerRef.kind") || ref.Group != r.value("tls.certManager.issuerRef.group") {
			t.Errorf("Certificate %s issuerRef %+v, want tls.certManager.issuerRef", name, ref)
		}
	}
	for name := range certs {
		t.Errorf("Certificate %s for no role of the release", name)
	}
	identities := false
	for _, role := range []string{"coordinator", "prefill", "decode"} {
		if s, _ := r.value("tls.identities." + role).(string); s != "" {
			identities = true
		}
	}
	for _, p := range pools(r) {
		if p.container == "coordinator" {
			continue
		}
		args := argMap(container(t, &r.deployment(t, p.deployment).Spec.Template.Spec, p.container).Args)
		for _, allow := range []string{"coordinator", "prefill"} {
			id, given := args["tls-allow-"+allow]
			generated := tlsOn && len(generatedTLS(t, r)) > 0
			if want := tlsOn && (cm || identities || generated); given != want {
				t.Errorf("%s: --tls-allow-%s given: %v, want %v", p.deployment, allow, given, want)
			}
			if !given {
				continue
			}
			// The roles whose certificates the flag names: its own; for
			// KV transfer, the elastic pool's too (TestElasticTLS).
			allowed := map[string]bool{allow: true}
			if e, _ := r.value("elastic.enabled").(bool); e && allow == "prefill" {
				allowed["elastic"] = true
			}
			names := func(sans []string) bool {
				return slices.ContainsFunc(strings.Split(id, ","), func(s string) bool { return slices.Contains(sans, s) })
			}
			for role, c := range byRole {
				if got := names(c.sans()); got != allowed[role] {
					t.Errorf("%s: --tls-allow-%s=%s is a name of the %s certificate (%v): %v, want %v",
						p.deployment, allow, id, role, c.sans(), got, allowed[role])
				}
			}
			for role, g := range generatedTLS(t, r) {
				if got := names(g.leaf.DNSNames); got != allowed[role] {
					t.Errorf("%s: --tls-allow-%s=%s is a name of the generated %s certificate (%v): %v, want %v",
						p.deployment, allow, id, role, g.leaf.DNSNames, got, allowed[role])
				}
			}
		}
	}
}

// checkNetworkPolicies: with networkPolicy.enabled every pdserve pod (and
// the bundled NATS) is isolated both ways by exactly one policy of the
// release; without, the release has none.
func checkNetworkPolicies(t *testing.T, r release) {
	on, _ := r.value("networkPolicy.enabled").(bool)
	pols := r.all("NetworkPolicy")
	if !on {
		if len(pols) > 0 {
			t.Errorf("%d NetworkPolicies without networkPolicy.enabled", len(pols))
		}
		return
	}
	for _, o := range r.all("Deployment") {
		d := o.obj.(*appsv1.Deployment)
		var by []string
		for _, po := range pols {
			np := po.obj.(*networkingv1.NetworkPolicy)
			sel := mustSelector(t, np.Spec.PodSelector.MatchLabels, np.Spec.PodSelector.MatchExpressions)
			if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				continue
			}
			by = append(by, po.name)
			if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
				t.Errorf("NetworkPolicy %s: policyTypes %v, want Ingress and Egress", po.name, np.Spec.PolicyTypes)
			}
		}
		want := 1
		if o.name == elasticName {
			want = 2 // the pool's and its live role's (TestElasticPolicySelection)
		}
		if len(by) != want {
			t.Errorf("pods of %s selected by NetworkPolicies %v, want exactly %d", o.name, by, want)
		}
	}
}

// endpoint is one party of a network flow: a pod (namespace, labels and
// named ports) or an address outside the cluster (namespace "").
type endpoint struct {
	namespace string
	labels    labels.Set
	ip        string
	ports     []corev1.ContainerPort
}

// policyAllows reports whether the NetworkPolicies of the release let src
// open a connection to dst's port: src's egress and dst's ingress both
// allow it (a pod no policy of a direction selects is not isolated in
// it). The policies are the release's only: other policies of the cluster
// are not modelled. An ipBlock matches addresses outside the cluster only
// (what it does for pod addresses depends on the network plugin).
func policyAllows(t *testing.T, pols []*networkingv1.NetworkPolicy, src, dst endpoint, port corev1.ContainerPort) bool {
	return directionAllows(t, pols, networkingv1.PolicyTypeEgress, src, dst, port) &&
		directionAllows(t, pols, networkingv1.PolicyTypeIngress, dst, src, port)
}

// directionAllows checks one direction: the policies of type typ that
// select self, for a connection with peer on port of the destination.
func directionAllows(t *testing.T, pols []*networkingv1.NetworkPolicy, typ networkingv1.PolicyType, self, peer endpoint, port corev1.ContainerPort) bool {
	isolated := false
	for _, np := range pols {
		if self.namespace != np.Namespace || !slices.Contains(np.Spec.PolicyTypes, typ) {
			continue
		}
		if !mustSelector(t, np.Spec.PodSelector.MatchLabels, np.Spec.PodSelector.MatchExpressions).Matches(self.labels) {
			continue
		}
		isolated = true
		if typ == networkingv1.PolicyTypeIngress {
			for _, rule := range np.Spec.Ingress {
				if peersMatch(t, rule.From, np.Namespace, peer) && portsMatch(rule.Ports, port) {
					return true
				}
			}
		} else {
			for _, rule := range np.Spec.Egress {
				if peersMatch(t, rule.To, np.Namespace, peer) && portsMatch(rule.Ports, port) {
					return true
				}
			}
		}
	}
	return !isolated
}

// peersMatch: no peers match everyone; else one of them must match ep
// (for a policy in namespace ns).
func peersMatch(t *testing.T, peers []networkingv1.NetworkPolicyPeer, ns string, ep endpoint) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if p.IPBlock != nil {
			if ep.namespace != "" {
				continue
			}
			ip := net.ParseIP(ep.ip)
			if _, block, err := net.ParseCIDR(p.IPBlock.CIDR); err != nil {
				t.Errorf("ipBlock %s: %v", p.IPBlock.CIDR, err)
				continue
			} else if !block.Contains(ip) {
				continue
			}
			excepted := false
			for _, e := range p.IPBlock.Except {
				if _, block, err := net.ParseCIDR(e); err == nil && block.Contains(ip) {
					excepted = true
				}
			}
			if !excepted {
				return true
			}
			continue
		}
		if ep.namespace == "" {
			continue
		}
		nsOK := ep.namespace == ns
		if p.NamespaceSelector != nil {
			nsOK = mustSelector(t, p.NamespaceSelector.MatchLabels, p.NamespaceSelector.MatchExpressions).
				Matches(labels.Set{"kubernetes.io/metadata.name": ep.namespace})
		}
		podOK := p.PodSelector == nil || mustSelector(t, p.PodSelector.MatchLabels, p.PodSelector.MatchExpressions).Matches(ep.labels)
		if nsOK && podOK {
			return true
		}
	}
	return false
}

// portsMatch: no ports match every port; else one must match the
// destination's port by number (or range) or name, and protocol.
func portsMatch(ports []networkingv1.NetworkPolicyPort, port corev1.ContainerPort) bool {
	if len(ports) == 0 {
		return true
	}
	proto := port.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, p := range ports {
		pp := corev1.ProtocolTCP
		if p.Protocol != nil {
			pp = *p.Protocol
		}
		if pp != proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.StrVal != "":
			if p.Port.StrVal == port.Name {
				return true
			}
		case p.EndPort != nil:
			if port.ContainerPort >= p.Port.IntVal && port.ContainerPort <= *p.EndPort {
				return true
			}
		case p.Port.IntVal == port.ContainerPort:
			return true
		}
	}
	return false
}

// flowEndpoints returns the parties of the flow table: the release's pods
// (by component), and beside them an Ingress controller, Prometheus and
// the cluster DNS where a production cluster runs them, a pod of another
// application in the release's namespace and one in another namespace,
// and a host outside the cluster.
func flowEndpoints(t *testing.T, r release) map[string]endpoint {
	eps := map[string]endpoint{}
	for name, spec := range r.podSpecs() {
		var ls map[string]string
		switch v := r.find(strings.Split(name, "/")[0], strings.Split(name, "/")[1]).(type) {
		case *appsv1.Deployment:
			ls = v.Spec.Template.Labels
		case *corev1.Pod:
			ls = v.Labels
		}
		var ports []corev1.ContainerPort
		for _, c := range spec.Containers {
			ports = append(ports, c.Ports...)
		}
		component := ls["app.kubernetes.io/component"]
		if component == "" {
			t.Fatalf("%s: no component label", name)
		}
		if ls[actuator.PoolLabel] == actuator.ElasticPool {
			// An elastic pod in each role, as the coordinator labels it.
			for _, role := range []string{"prefill", "decode"} {
				rl := maps.Clone(ls)
				rl[actuator.RoleLabel] = role
				eps["elastic("+role+")"] = endpoint{namespace: namespace, labels: rl, ports: ports}
			}
			continue
		}
		eps[component] = endpoint{namespace: namespace, labels: ls, ports: ports}
	}
	tcp := func(name string, port int32) corev1.ContainerPort {
		return corev1.ContainerPort{Name: name, ContainerPort: port, Protocol: corev1.ProtocolTCP}
	}
	eps["ingress-nginx"] = endpoint{namespace: "ingress-nginx", labels: labels.Set{"app.kubernetes.io/name": "ingress-nginx"}, ports: []corev1.ContainerPort{tcp("https", 443)}}
	eps["prometheus"] = endpoint{namespace: "monitoring", labels: labels.Set{"app.kubernetes.io/name": "prometheus"}, ports: []corev1.ContainerPort{tcp("web", 9090)}}
	eps["kube-dns"] = endpoint{namespace: "kube-system", labels: labels.Set{"k8s-app": "kube-dns"}, ports: []corev1.ContainerPort{
		{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}, tcp("dns-tcp", 53)}}
	eps["neighbour"] = endpoint{namespace: namespace, labels: labels.Set{"app": "neighbour"}, ports: []corev1.ContainerPort{tcp("http", 8080)}}
	eps["tenant"] = endpoint{namespace: "tenant-b", labels: labels.Set{"app": "tenant"}, ports: []corev1.ContainerPort{tcp("http", 8080)}}
	eps["internet"] = endpoint{ip: "203.0.113.10", ports: []corev1.ContainerPort{tcp("https", 443), tcp("nats", 4222)}}
	eps["otel-collector"] = endpoint{namespace: "observability", labels: labels.Set{"app.kubernetes.io/name": "opentelemetry-collector"},
		ports: []corev1.ContainerPort{tcp("otlp-grpc", 4317), tcp("otlp-http", 4318)}}
	return eps
}

// allowedFlows returns every connection the release's NetworkPolicies
// allow to or from one of its isolated pods, as "src → dst:port".
func allowedFlows(t *testing.T, r release) []string {
	var pols []*networkingv1.NetworkPolicy
	for _, o := range r.all("NetworkPolicy") {
		pols = append(pols, o.obj.(*networkingv1.NetworkPolicy))
	}
	eps := flowEndpoints(t, r)
	isolated := func(ep endpoint) bool {
		for _, np := range pols {
			if ep.namespace == np.Namespace && mustSelector(t, np.Spec.PodSelector.MatchLabels, np.Spec.PodSelector.MatchExpressions).Matches(ep.labels) {
				return true
			}
		}
		return false
	}
	var out []string
	for srcName, src := range eps {
		for dstName, dst := range eps {
			if !isolated(src) && !isolated(dst) {
				continue // neither side is the release's concern
			}
			for _, port := range dst.ports {
				if policyAllows(t, pols, src, dst, port) {
					out = append(out, fmt.Sprintf("%s → %s:%s", srcName, dstName, port.Name))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// mergeValues returns base with over merged in: maps merge, other values
// are replaced.
func mergeValues(base, over map[string]any) map[string]any {
	out := maps.Clone(base)
	for k, v := range over {
		if vm, ok := v.(map[string]any); ok {
			if bm, ok := out[k].(map[string]any); ok {
				out[k] = mergeValues(bm, vm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// renderOver renders the chart for the values file of set base (""
// for defaults) with over (YAML) merged in.
func renderOver(t *testing.T, base, over string) release {
	t.Helper()
	vals := map[string]any{}
	if base != "" {
		b, err := os.ReadFile(filepath.Join(chartDir, "ci", base+"-values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &vals); err != nil {
			t.Fatal(err)
		}
	}
	var o map[string]any
	if err := yaml.Unmarshal([]byte(over), &o); err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(mergeValues(vals, o))
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return render(t, valuesSet{name: base + "+override", file: f})
}

// Flows every release with NetworkPolicies allows: the coordinator calls
// the workers, prefill pushes KV to decode, everyone resolves names and
// reaches NATS. NATS itself and the workers' gRPC ports admit nobody else.
var (
	internalFlows = []string{
		"coordinator → decode:grpc",
		"coordinator → kube-dns:dns",
		"coordinator → kube-dns:dns-tcp",
		"coordinator → nats:client",
		"coordinator → prefill:grpc",
		"decode → kube-dns:dns",
		"decode → kube-dns:dns-tcp",
		"decode → nats:client",
		"prefill → decode:grpc",
		"prefill → kube-dns:dns",
		"prefill → kube-dns:dns-tcp",
		"prefill → nats:client",
	}
	// The coordinator's HTTP port and the workers' metrics ports, for
	// anyone not isolated by the release (clients.from and metrics.from
	// empty); the release's own pods still only reach what their egress
	// rules allow.
	openFlows = func() []string {
		var out []string
		for _, src := range []string{"ingress-nginx", "internet", "kube-dns", "neighbour", "otel-collector", "prometheus", "tenant", "test"} {
			for _, dst := range []string{"coordinator:http", "decode:metrics", "prefill:metrics"} {
				out = append(out, src+" → "+dst)
			}
		}
		return out
	}()
)

// TestNetworkPolicyFlows renders releases with NetworkPolicies and checks
// that they allow exactly the listed connections among the release's
// pods, an Ingress controller, Prometheus, the cluster DNS, a neighbour
// pod, another namespace, an OpenTelemetry Collector and the internet
// (flowEndpoints).
func TestNetworkPolicyFlows(t *testing.T) {
	tests := []struct {
		name, base, over string
		want             []string
	}{
		{
			name: "production", base: "production",
			want: append(slices.Clone(internalFlows),
				"ingress-nginx → coordinator:http",
				"prometheus → coordinator:http",
				"prometheus → decode:metrics",
				"prometheus → prefill:metrics",
				"test → coordinator:http"),
		},
		{
			// The chart's defaults with policies on: the front door and
			// the metrics ports are open, the workers' gRPC and NATS are
			// not.
			name: "defaults", over: "networkPolicy: {enabled: true}",
			want: append(slices.Clone(internalFlows), openFlows...),
		},
		{
			name: "colocated", base: "production", over: "coordinator: {mode: colocated}\ndecodeWorker: {role: colocated}",
			want: []string{
				"coordinator → decode:grpc", "coordinator → kube-dns:dns", "coordinator → kube-dns:dns-tcp", "coordinator → nats:client",
				"decode → kube-dns:dns", "decode → kube-dns:dns-tcp", "decode → nats:client",
				"ingress-nginx → coordinator:http", "prometheus → coordinator:http", "prometheus → decode:metrics", "test → coordinator:http",
			},
		},
		{
			// The planner's actuator reaches the API server; an ipBlock
			// stands for it here.
			name: "planner-actuator", base: "production",
			// production serves llama.cpp: the planner sizes the pools
			// by a profile of its own.
			over: "coordinator: {planner: {actuator: kubernetes, profile: h100/llama-3-8b/tp1}}\nnetworkPolicy: {kubeAPIServer: {to: [{ipBlock: {cidr: 203.0.113.0/24}}], ports: [443]}}",
			want: append(slices.Clone(internalFlows),
				"coordinator → internet:https",
				"ingress-nginx → coordinator:http", "prometheus → coordinator:http", "prometheus → decode:metrics",
				"prometheus → prefill:metrics", "test → coordinator:http"),
		},
		{
			// The elastic pool: KV both ways within it whatever its pods'
			// role labels say, to and from the fixed pools; its metrics
			// open like the fixed pools' (metrics.from empty).
			name: "elastic", base: "production",
			over: "elastic: {enabled: true}\ntls: {enabled: false, certManager: {enabled: false}}\nnetworkPolicy: {kubeAPIServer: {to: [{ipBlock: {cidr: 203.0.113.0/24}}], ports: [443]}}",
			want: append(append(slices.Clone(internalFlows), elasticFlows...),
				"ingress-nginx → coordinator:http", "prometheus → coordinator:http", "prometheus → decode:metrics",
				"prometheus → prefill:metrics", "prometheus → elastic(prefill):metrics", "prometheus → elastic(decode):metrics",
				"test → coordinator:http"),
		},
		{
			// Traces to a collector the policies name, on its gRPC port;
			// off (the other cases), no pod reaches it.
			name: "tracing", base: "production",
			over: "tracing: {endpoint: 'http://otel-collector.observability:4317', protocol: grpc}\n" +
				"networkPolicy: {tracing: {to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: observability}}, " +
				"podSelector: {matchLabels: {app.kubernetes.io/name: opentelemetry-collector}}}], ports: [4317]}}",
			want: append(slices.Clone(internalFlows),
				"coordinator → otel-collector:otlp-grpc", "decode → otel-collector:otlp-grpc", "prefill → otel-collector:otlp-grpc",
				"ingress-nginx → coordinator:http", "prometheus → coordinator:http", "prometheus → decode:metrics",
				"prometheus → prefill:metrics", "test → coordinator:http"),
		},
		{
			// An external NATS server, at an address the policies name.
			name: "external-nats", base: "external-nats",
			over: "networkPolicy: {enabled: true, externalNATS: {to: [{ipBlock: {cidr: 203.0.113.0/24}}], ports: [4222]}}",
			want: append(slices.DeleteFunc(slices.Clone(internalFlows), func(f string) bool { return strings.HasSuffix(f, "nats:client") }),
				append(slices.Clone(openFlows), "coordinator → internet:nats", "decode → internet:nats", "prefill → internet:nats")...),
		},
		{
			// The model download reaches any host on 443 (modelDownload.to
			// empty), the Ingress controller's pods included.
			name: "model-download", base: "llamacpp-cpu",
			over: "model: {source: download, download: {url: 'https://models.example.com/m.gguf', sizeLimit: 2Gi}}\nnetworkPolicy: {enabled: true}",
			want: append(append(slices.Clone(internalFlows), openFlows...),
				"coordinator → ingress-nginx:https", "coordinator → internet:https",
				"decode → ingress-nginx:https", "decode → internet:https",
				"prefill → ingress-nginx:https", "prefill → internet:https"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := renderOver(t, tc.base, tc.over)
			want := slices.Sorted(slices.Values(tc.want))
			if diff := cmp.Diff(want, allowedFlows(t, r)); diff != "" {
				t.Errorf("allowed flows (-want +got):\n%s", diff)
			}
		})
	}
}

// grpcCaller is who calls a worker in TestGRPCRoles: the token it sends
// and the client certificate the TLS handshake verified (nil: none).
type grpcCaller struct {
	token string
	leaf  *x509.Certificate
}

// ctx is the server-side context of a call from c.
func (c grpcCaller) ctx() context.Context {
	ctx := context.Background()
	if c.token != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+c.token))
	}
	p := &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 40000}}
	if c.leaf != nil {
		p.AuthInfo = credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c.leaf}}}}
	}
	return peer.NewContext(ctx, p)
}

// workerAuth loads the gRPC authorization a worker pool's container gets
// from the release: its grpcauth flags (--grpc-*-file, --tls-allow-*)
// and the files mounted there.
func workerAuth(t *testing.T, r release, p pool) *grpcauth.Auth {
	t.Helper()
	spec := &r.deployment(t, p.deployment).Spec.Template.Spec
	c := container(t, spec, p.container)
	var o grpcauth.Options
	fs := flag.NewFlagSet(p.container, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs, true)
	var args []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--grpc-token-file=") || strings.HasPrefix(a, "--grpc-prefill-token-file=") || strings.HasPrefix(a, "--tls-allow-") {
			args = append(args, a)
		}
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%s: %v", p.deployment, err)
	}
	if err := localizeGRPCAuth(r.mounts(t, spec, c), t.TempDir(), &o); err != nil {
		t.Fatalf("%s: %v", p.deployment, err)
	}
	present := grpcauth.Role(0)
	if p.container == "prefill-worker" {
		present = grpcauth.RolePrefill
	}
	a, err := o.Load(present, nil)
	if err != nil {
		t.Fatalf("%s: %v", p.deployment, err)
	}
	return a
}

// mountedToken returns the token a component sends: the content of the
// file its flag names, as mounted.
func mountedToken(t *testing.T, r release, p pool, flagName string) string {
	t.Helper()
	spec := &r.deployment(t, p.deployment).Spec.Template.Spec
	c := container(t, spec, p.container)
	path, ok := argMap(c.Args)[flagName]
	if !ok {
		return ""
	}
	content, ok := r.mounts(t, spec, c)[path]
	if !ok {
		t.Fatalf("%s: --%s=%s: nothing mounted there", p.deployment, flagName, path)
	}
	return strings.TrimSpace(content)
}

// TestGRPCRoles: the workers of a release, authorizing calls exactly as
// their interceptors do (grpcauth, loaded from the rendered flags and
// mounted files), serve DecodeService and PrefillService only to the
// coordinator and KV pushes only to prefill workers; decode workers,
// neighbours without credentials and, with per-role certificates, a
// worker that stole the other role's token are refused.
func TestGRPCRoles(t *testing.T) {
	decodeMethods := []string{pdservev1.DecodeService_Reserve_FullMethodName, pdservev1.DecodeService_Generate_FullMethodName, pdservev1.DecodeService_Cancel_FullMethodName}
	prefillMethods := []string{pdservev1.PrefillService_Prefill_FullMethodName, pdservev1.PrefillService_Resend_FullMethodName, pdservev1.PrefillService_Release_FullMethodName}
	push := pdservev1.KVTransferService_Push_FullMethodName
	for _, set := range []string{"", "tls", "production"} {
		name := set
		if name == "" {
			name = "defaults"
		}
		t.Run(name, func(t *testing.T) {
			r := renderOver(t, set, "{}")
			coord := pool{coordinatorName, "coordinator", "coordinator"}
			prefill := pool{prefillName, "prefill-worker", "prefillWorker"}
			decode := pool{decodeName, "decode-worker", "decodeWorker"}
			leaves := map[string]*x509.Certificate{}
			for _, o := range r.all("Certificate") {
				c := o.obj.(*certificate)
				ca := tlstest.NewCA(t, "sample CA")
				leaves[strings.TrimPrefix(o.name, releaseName+"-pdserve-")] = ca.Issue(t, certLeaf(t, c)).Cert
			}
			for role, g := range generatedTLS(t, r) {
				leaves[role] = g.leaf
			}
			callers := map[string]grpcCaller{
				"coordinator": {mountedToken(t, r, coord, "grpc-token-file"), leaves["coordinator"]},
				"prefill":     {mountedToken(t, r, prefill, "grpc-prefill-token-file"), leaves["prefill"]},
				"decode":      {"", leaves["decode"]},
				"neighbour":   {},
				"wrong token": {token: "not-the-token-0123456789abcdef", leaf: leaves["coordinator"]},
			}
			if len(leaves) > 0 {
				// Each role's certificate with the other role's token.
				callers["prefill with the coordinator's token"] = grpcCaller{callers["coordinator"].token, leaves["prefill"]}
				callers["coordinator with the prefill token"] = grpcCaller{callers["prefill"].token, leaves["coordinator"]}
			}
			if callers["coordinator"].token == "" {
				t.Fatal("the coordinator sends no token")
			}
			servers := map[string]*grpcauth.Auth{"prefill": workerAuth(t, r, prefill), "decode": workerAuth(t, r, decode)}
			want := map[string]bool{} // "server method caller" → allowed
			for _, m := range decodeMethods {
				want["decode "+m+" coordinator"] = true
			}
			for _, m := range prefillMethods {
				want["prefill "+m+" coordinator"] = true
			}
			want["decode "+push+" prefill"] = true
			var got []string
			for server, a := range servers {
				methods := append(slices.Clone(decodeMethods), push)
				if server == "prefill" {
					methods = prefillMethods
				}
				for _, m := range methods {
					for who, c := range callers {
						_, err := a.UnaryServerInterceptor()(c.ctx(), nil, &grpc.UnaryServerInfo{FullMethod: m},
							func(context.Context, any) (any, error) { return nil, nil })
						key := server + " " + m + " " + who
						if (err == nil) != want[key] {
							got = append(got, fmt.Sprintf("%s: allowed %v, want %v (%v)", key, err == nil, want[key], err))
						}
					}
				}
			}
			sort.Strings(got)
			for _, g := range got {
				t.Error(g)
			}
		})
	}
}

// fakeCluster serves lookup from a fake dynamic client.
type fakeCluster struct{ client dynamic.Interface }

func (f fakeCluster) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	if apiVersion != "v1" || kind != "Secret" {
		return nil, false, fmt.Errorf("fake cluster: no %s %s", apiVersion, kind)
	}
	return f.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}), true, nil
}

// TestGRPCTokensKeptOnUpgrade: the generated tokens are random at install
// and the same on an upgrade, where lookup finds the release's Secret.
func TestGRPCTokensKeptOnUpgrade(t *testing.T) {
	ch := loadChart(t)
	top, err := renderValues(ch, "")
	if err != nil {
		t.Fatal(err)
	}
	tokenSecret := func(files map[string]string) *corev1.Secret {
		t.Helper()
		for _, doc := range releaseutil.SplitManifests(files["pdserve/templates/grpc-token-secret.yaml"]) {
			if o, err := decodeStrict(doc); err == nil && o.name == generatedTokenSecret {
				return o.obj.(*corev1.Secret)
			}
		}
		t.Fatalf("no Secret %s rendered", generatedTokenSecret)
		return nil
	}
	renderFiles := func(cluster engine.ClientProvider) map[string]string {
		t.Helper()
		var files map[string]string
		var err error
		if cluster == nil {
			files, err = engine.Render(ch, top)
		} else {
			files, err = engine.RenderWithClientProvider(ch, top, cluster)
		}
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	installed := tokenSecret(renderFiles(nil))
	if again := tokenSecret(renderFiles(nil)); string(again.Data["coordinator.token"]) == string(installed.Data["coordinator.token"]) {
		t.Error("two installs generated the same token")
	}
	data := map[string]any{}
	for k, v := range installed.Data {
		data[k] = base64.StdEncoding.EncodeToString(v)
	}
	live := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": generatedTokenSecret, "namespace": namespace},
		"type":     "Opaque", "data": data,
	}}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{{Version: "v1", Resource: "secrets"}: "SecretList"}, live)
	upgraded := tokenSecret(renderFiles(fakeCluster{client}))
	if diff := cmp.Diff(installed.Data, upgraded.Data); diff != "" {
		t.Errorf("tokens changed on upgrade (-installed +upgraded):\n%s", diff)
	}
}

// writeValues writes YAML values into a scratch file and returns its path.
func writeValues(t *testing.T, values string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestTLSRoleSeparation: TLS settings under which one role's certificate
// could act in another's fail to render, saying why; a certificate per
// role from Secrets of the user's, with identities, renders workers that
// allow exactly those identities and whose flags and files validate.
func TestTLSRoleSeparation(t *testing.T) {
	refused := []struct{ name, values, want string }{
		{"identity is the server name", `
tls: {enabled: true, certManager: {enabled: true, issuerRef: {name: ca}}, identities: {coordinator: pdserve-grpc}}`,
			"must differ from tls.serverName"},
		{"one identity for two roles", `
tls: {enabled: true, certManager: {enabled: true, issuerRef: {name: ca}}, identities: {coordinator: pd.example.com, prefill: pd.example.com}}`,
			"must differ"},
		{"identities with one shared certificate", `
tls: {enabled: true, existingSecret: grpc-tls, identities: {coordinator: coordinator.example.com, prefill: prefill.example.com}}`,
			"need a certificate per role"},
		{"an identity for one role only", `
tls: {enabled: true, roleSecrets: {coordinator: c-tls, prefill: p-tls, decode: d-tls}, identities: {coordinator: coordinator.example.com}}`,
			"give both coordinator and prefill"},
	}
	ch := loadChart(t)
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			err := renderError(t, ch, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render error %v, want one saying %q", err, tc.want)
			}
		})
	}
	t.Run("a certificate per role from Secrets", func(t *testing.T) {
		r := render(t, valuesSet{name: "role-secrets", file: writeValues(t, `
tls:
  enabled: true
  roleSecrets: {coordinator: coordinator-tls, prefill: prefill-tls, decode: decode-tls}
  identities: {coordinator: "spiffe://example.org/pdserve/coordinator", prefill: prefill.pdserve.example.org}
`)})
		checkPods(t, r)
		checkFlags(t, r)
		for _, p := range pools(r) {
			spec := &r.deployment(t, p.deployment).Spec.Template.Spec
			role := containerRole[p.container]
			if v := findVolume(spec, "tls"); v == nil || v.Secret == nil || v.Secret.SecretName != role+"-tls" {
				t.Errorf("%s: tls volume %+v, want Secret %s-tls", p.deployment, v, role)
			}
			if role == "coordinator" {
				continue
			}
			args := argMap(container(t, spec, p.container).Args)
			if args["tls-allow-coordinator"] != "spiffe://example.org/pdserve/coordinator" || args["tls-allow-prefill"] != "prefill.pdserve.example.org" {
				t.Errorf("%s: --tls-allow-coordinator=%q --tls-allow-prefill=%q, want tls.identities", p.deployment, args["tls-allow-coordinator"], args["tls-allow-prefill"])
			}
		}
	})
}
