package charttest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	pdservev1 "github.com/pdserve/pdserve/api/pdserve/v1"
	"github.com/pdserve/pdserve/pkg/grpcauth"
	"github.com/pdserve/pdserve/pkg/grpcnet"
)

// roleTLS is a role's certificate as the chart generated it: the
// Secret's files and its parsed leaf and CA.
type roleTLS struct {
	files map[string]string // tls.crt, tls.key, ca.crt
	leaf  *x509.Certificate
	ca    *x509.Certificate
}

// tlsSecretName is the Secret a role's generated (or cert-manager)
// certificate is in.
func tlsSecretName(role string) string { return releaseName + "-pdserve-" + role + "-tls" }

// generatedTLS returns, per role, the certificates of the release's
// generated TLS Secrets (tls-secrets.yaml); empty when it has none.
func generatedTLS(t *testing.T, r release) map[string]roleTLS {
	t.Helper()
	out := map[string]roleTLS{}
	for _, o := range r.all("Secret") {
		s := o.obj.(*corev1.Secret)
		if o.source != "pdserve/templates/tls-secrets.yaml" {
			continue
		}
		role := strings.TrimSuffix(strings.TrimPrefix(o.name, releaseName+"-pdserve-"), "-tls")
		if o.name != tlsSecretName(role) || s.Type != corev1.SecretTypeTLS {
			t.Errorf("generated TLS Secret %s of type %s, want %s of type %s", o.name, s.Type, tlsSecretName(role), corev1.SecretTypeTLS)
		}
		out[role] = parseRoleTLS(t, o.name, s.Data)
	}
	return out
}

// parseRoleTLS parses the files of a kubernetes.io/tls Secret.
func parseRoleTLS(t *testing.T, name string, data map[string][]byte) roleTLS {
	t.Helper()
	g := roleTLS{files: map[string]string{}}
	for k, v := range data {
		g.files[k] = string(v)
	}
	parse := func(key string) *x509.Certificate {
		b, _ := pem.Decode(data[key])
		if b == nil || b.Type != "CERTIFICATE" {
			t.Fatalf("%s: %s holds no PEM certificate", name, key)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatalf("%s: %s: %v", name, key, err)
		}
		return c
	}
	g.leaf, g.ca = parse("tls.crt"), parse("ca.crt")
	return g
}

// loadRoleTLS loads a role's files as its binary does (--tls-cert,
// --tls-key, --tls-ca, --tls-server-name).
func loadRoleTLS(t *testing.T, g roleTLS, serverName string, use grpcnet.TLSUse) *grpcnet.TLS {
	t.Helper()
	dir := t.TempDir()
	o := grpcnet.TLSOptions{ServerName: serverName}
	for key, dst := range map[string]*string{"tls.crt": &o.CertFile, "tls.key": &o.KeyFile, "ca.crt": &o.CAFile} {
		*dst = filepath.Join(dir, key)
		if err := os.WriteFile(*dst, []byte(g.files[key]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := o.Load(use, zap.NewNop())
	if err != nil {
		t.Fatalf("loading the generated certificate: %v", err)
	}
	return l
}

// handshake runs a TLS handshake over loopback between a server with
// srv's configuration and a client with cli, and returns the server's
// view of the connection (the client certificate it verified).
func handshake(t *testing.T, srv, cli *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		state tls.ConnectionState
		err   error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		s := tls.Server(c, srv)
		err = s.Handshake()
		if err == nil {
			// TLS 1.3: the server learns the client's verdict on its
			// certificate only when it reads.
			_, err = s.Read(make([]byte, 1))
		}
		done <- result{s.ConnectionState(), err}
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String(), cli)
	if err == nil {
		_, err = c.Write([]byte{1})
		c.Close()
	}
	res := <-done
	return res.state, errors.Join(err, res.err)
}

// TestGeneratedTLS: with TLS on and no certificates of the user's (the
// default), the chart makes one CA and a certificate per role: ECDSA
// P-256, the CA's key in no Secret, each naming its role's identity and
// (workers) tls.serverName, valid tls.generated.validityDays; each pod
// mounts its own and rolls when the CA changes. Loaded as the binaries
// load them, a handshake over loopback passes between the coordinator and
// each worker, the server's identity checked with the coordinator's
// --tls-worker-identity and the client's authorized as the worker's
// grpcauth does; a worker whose certificate names another role is
// refused.
func TestGeneratedTLS(t *testing.T) {
	const days = 3650 // values.yaml: tls.generated.validityDays
	tests := []struct {
		name, base, over string
		roles            []string
		ids              map[string]string // role → identity
	}{
		{"defaults", "", "{}", []string{"coordinator", "decode", "prefill"}, nil},
		{"colocated", "colocated", "{}", []string{"coordinator", "decode"}, nil},
		{"identities", "", "tls: {identities: {prefill: prefill.pdserve.example.org}}", []string{"coordinator", "decode", "prefill"},
			map[string]string{"prefill": "prefill.pdserve.example.org"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := renderOver(t, tc.base, tc.over)
			gen := generatedTLS(t, r)
			if diff := cmp.Diff(tc.roles, slices.Sorted(func(yield func(string) bool) {
				for role := range gen {
					if !yield(role) {
						return
					}
				}
			})); diff != "" {
				t.Fatalf("generated TLS Secrets per role (-want +got):\n%s", diff)
			}
			serverName := r.value("tls.serverName").(string)
			ca := gen["coordinator"].ca
			if !ca.IsCA || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
				t.Errorf("ca.crt is no CA: IsCA %v, key usage %v", ca.IsCA, ca.KeyUsage)
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca)
			identity := func(role string) string {
				if id, ok := tc.ids[role]; ok {
					return id
				}
				return role + "." + releaseName + "-pdserve." + namespace + ".pdserve.internal"
			}
			for role, g := range gen {
				if !g.ca.Equal(ca) {
					t.Errorf("%s: ca.crt is another CA than the coordinator's", role)
				}
				if _, err := g.leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
					t.Errorf("%s: the certificate does not verify against ca.crt: %v", role, err)
				}
				pair, err := tls.X509KeyPair([]byte(g.files["tls.crt"]), []byte(g.files["tls.key"]))
				if err != nil {
					t.Errorf("%s: tls.key does not match tls.crt: %v", role, err)
					continue
				}
				key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
				if !ok || key.Curve != elliptic.P256() {
					t.Errorf("%s: key %T, want ECDSA P-256", role, pair.PrivateKey)
				} else if caKey, ok := ca.PublicKey.(*ecdsa.PublicKey); ok && caKey.Equal(key.Public()) {
					t.Errorf("%s: tls.key is the CA's key", role)
				}
				want := []string{identity(role)}
				if role != "coordinator" {
					want = []string{serverName, identity(role)}
				}
				if diff := cmp.Diff(want, g.leaf.DNSNames); diff != "" {
					t.Errorf("%s: DNS names (-want +got):\n%s", role, diff)
				}
				if len(g.leaf.URIs) != 0 || len(g.leaf.IPAddresses) != 0 {
					t.Errorf("%s: names URIs %v and addresses %v, want none", role, g.leaf.URIs, g.leaf.IPAddresses)
				}
				if life := g.leaf.NotAfter.Sub(g.leaf.NotBefore); life < (days-1)*24*time.Hour || life > (days+1)*24*time.Hour {
					t.Errorf("%s: valid %v, want %d days", role, life, days)
				}
			}
			caSum := sha256.Sum256([]byte(gen["coordinator"].files["ca.crt"]))
			for _, p := range pools(r) {
				spec := &r.deployment(t, p.deployment).Spec.Template.Spec
				role := containerRole[p.container]
				if v := findVolume(spec, "tls"); v == nil || v.Secret == nil || v.Secret.SecretName != tlsSecretName(role) {
					t.Errorf("%s: tls volume %+v, want Secret %s", p.deployment, v, tlsSecretName(role))
				}
				if got := r.deployment(t, p.deployment).Spec.Template.Annotations["checksum/tls-ca"]; got != hex.EncodeToString(caSum[:]) {
					t.Errorf("%s: pod annotation checksum/tls-ca %q, want the CA's digest", p.deployment, got)
				}
			}

			coordArgs := argMap(container(t, &r.deployment(t, coordinatorName).Spec.Template.Spec, "coordinator").Args)
			templates := strings.Split(coordArgs["tls-worker-identity"], ",")
			coordinator := loadRoleTLS(t, gen["coordinator"], serverName, grpcnet.TLSDial)
			workerRoles := map[string]string{"decode": "decode", "prefill": "prefill"} // Secret role → heartbeat role
			workerPools := map[string]pool{"decode": {decodeName, "decode-worker", "decodeWorker"}, "prefill": {prefillName, "prefill-worker", "prefillWorker"}}
			if tc.base == "colocated" {
				workerRoles = map[string]string{"decode": "colocated"}
			}
			for role, hbRole := range workerRoles {
				worker := loadRoleTLS(t, gen[role], serverName, grpcnet.TLSServe|grpcnet.TLSDial)
				cli := grpcauth.VerifyWorker(coordinator.ClientConfig(), templates, hbRole, releaseName+"-pdserve-"+role+"-5d8f7c9b4-x2x7q")
				state, err := handshake(t, worker.ServerConfig(), cli)
				if err != nil {
					t.Errorf("coordinator → %s: handshake: %v", role, err)
					continue
				}
				// The worker's interceptor authorizes the verified client
				// certificate as the coordinator.
				method := pdservev1.DecodeService_Reserve_FullMethodName
				if role == "prefill" {
					method = pdservev1.PrefillService_Prefill_FullMethodName
				}
				caller := grpcCaller{mountedToken(t, r, pool{coordinatorName, "coordinator", "coordinator"}, "grpc-token-file"), nil}
				ctx := peer.NewContext(caller.ctx(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, AuthInfo: credentials.TLSInfo{State: state}})
				if _, err := workerAuth(t, r, workerPools[role]).UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method},
					func(context.Context, any) (any, error) { return nil, nil }); err != nil {
					t.Errorf("%s: the coordinator's verified certificate is refused for %s: %v", role, method, err)
				}
			}
			if _, ok := gen["prefill"]; ok {
				// A prefill worker's certificate, served as a decode
				// worker's: the coordinator's identity check refuses it in
				// the handshake.
				prefill := loadRoleTLS(t, gen["prefill"], serverName, grpcnet.TLSServe|grpcnet.TLSDial)
				cli := grpcauth.VerifyWorker(coordinator.ClientConfig(), templates, "decode", "decode--evil")
				if _, err := handshake(t, prefill.ServerConfig(), cli); !errors.Is(err, grpcauth.ErrIdentity) {
					t.Errorf("the prefill certificate as a decode worker: handshake error %v, want %v", err, grpcauth.ErrIdentity)
				}
			}
		})
	}
}

// TestGeneratedTLSRefusals: generated certificates carry DNS names only,
// and a renewal window must be shorter than the lifetime.
func TestGeneratedTLSRefusals(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct{ name, values, want string }{
		{"a URI identity", `tls: {identities: {coordinator: "spiffe://example.org/c", prefill: "spiffe://example.org/p"}}`, "DNS names only"},
		{"an upper-case identity", `tls: {identities: {prefill: Prefill.Example.org}}`, "DNS names only"},
		{"renewal longer than the lifetime", `tls: {generated: {validityDays: 30, renewDays: 30}}`, "renewDays must be less than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := renderError(t, ch, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestGeneratedTLSKeptOnUpgrade: an upgrade, where lookup finds the
// release's TLS Secrets, keeps every certificate and the CA byte for
// byte; it makes all anew (a new CA) when a Secret is gone, when the names
// they were made for changed, or when they expire within
// tls.generated.renewDays. Two installs make different CAs.
func TestGeneratedTLSKeptOnUpgrade(t *testing.T) {
	ch := loadChart(t)
	renderTLS := func(t *testing.T, values string, live ...runtime.Object) map[string]*corev1.Secret {
		t.Helper()
		file := ""
		if values != "" {
			file = writeValues(t, values)
		}
		top, err := renderValues(ch, file)
		if err != nil {
			t.Fatal(err)
		}
		var files map[string]string
		if live == nil {
			files, err = engine.Render(ch, top)
		} else {
			client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
				map[schema.GroupVersionResource]string{{Version: "v1", Resource: "secrets"}: "SecretList"}, live...)
			files, err = engine.RenderWithClientProvider(ch, top, fakeCluster{client})
		}
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*corev1.Secret{}
		for _, doc := range releaseutil.SplitManifests(files["pdserve/templates/tls-secrets.yaml"]) {
			if isBlank(doc) {
				continue
			}
			o, err := decodeStrict(doc)
			if err != nil {
				t.Fatal(err)
			}
			out[o.name] = o.obj.(*corev1.Secret)
		}
		if len(out) != 3 {
			t.Fatalf("rendered %d TLS Secrets, want 3", len(out))
		}
		return out
	}
	installed := renderTLS(t, "")
	caOf := func(s map[string]*corev1.Secret) string {
		return string(s[tlsSecretName("coordinator")].Data["ca.crt"])
	}
	if caOf(renderTLS(t, "")) == caOf(installed) {
		t.Error("two installs made the same CA")
	}
	// liveSecrets are the installed Secrets as the cluster returns them,
	// but for those named in drop, and with notAfter as their expiry
	// annotation where it is set.
	liveSecrets := func(notAfter string, drop ...string) []runtime.Object {
		var out []runtime.Object
		for name, s := range installed {
			if slices.Contains(drop, name) {
				continue
			}
			data := map[string]any{}
			for k, v := range s.Data {
				data[k] = base64.StdEncoding.EncodeToString(v)
			}
			ann := map[string]any{}
			for k, v := range s.Annotations {
				ann[k] = v
			}
			if notAfter != "" {
				ann["pdserve.io/tls-not-after"] = notAfter
			}
			out = append(out, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Secret",
				"metadata": map[string]any{"name": name, "namespace": namespace, "annotations": ann},
				"type":     string(s.Type), "data": data,
			}})
		}
		return out
	}
	t.Run("kept", func(t *testing.T) {
		upgraded := renderTLS(t, "", liveSecrets("")...)
		for name, s := range installed {
			if diff := cmp.Diff(s.Data, upgraded[name].Data); diff != "" {
				t.Errorf("%s changed on upgrade (-installed +upgraded):\n%s", name, diff)
			}
			if diff := cmp.Diff(s.Annotations, upgraded[name].Annotations); diff != "" {
				t.Errorf("%s annotations changed on upgrade (-installed +upgraded):\n%s", name, diff)
			}
		}
	})
	soon := time.Now().Add(10 * 24 * time.Hour).UTC().Format(time.RFC3339)
	later := time.Now().Add(40 * 24 * time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name, values string
		live         []runtime.Object
		renewed      bool
	}{
		{"a Secret deleted", "", liveSecrets("", tlsSecretName("decode")), true},
		{"tls.serverName changed", "tls: {serverName: pdserve-grpc-2}", liveSecrets(""), true},
		{"expiring in 10 days", "", liveSecrets(soon), true},
		{"expiring in 40 days", "", liveSecrets(later), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upgraded := renderTLS(t, tc.values, tc.live...)
			for name, s := range upgraded {
				same := bytes.Equal(s.Data["tls.crt"], installed[name].Data["tls.crt"])
				if same == tc.renewed {
					t.Errorf("%s: kept %v, want %v", name, same, !tc.renewed)
				}
			}
			if renewed := caOf(upgraded) != caOf(installed); renewed != tc.renewed {
				t.Errorf("new CA %v, want %v", renewed, tc.renewed)
			}
		})
	}
}
