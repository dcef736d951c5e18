//go:build k8se2e

package k8se2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pdserve/pdserve/pkg/grpcnet/tlstest"
)

// The regions step: two regions, each release regionRel in a namespace
// of its own, as docs/regions.md installs them in two clusters.
const (
	regionRel       = "rg"
	regionTLSSecret = "pdserve-region-tls"
	regionPort      = 8443
	regionGWPort    = 7222
)

type e2eRegion struct{ name, ns string }

var e2eRegions = []e2eRegion{{"us-east", "pdserve-us-east"}, {"eu-west", "pdserve-eu-west"}}

// forwardHost is the DNS name of r's forwarding Service, the host of its
// advertise URL; gatewayHost that of its NATS gateway Service.
func (r e2eRegion) forwardHost() string {
	return regionRel + "-pdserve-coordinator-region." + r.ns + ".svc.cluster.local"
}

func (r e2eRegion) gatewayHost() string {
	return regionRel + "-pdserve-nats-gateway." + r.ns + ".svc.cluster.local"
}

// TestK8sE2ERegions runs the regions step alone, on the cluster of make
// k8s-up with the images of make images: PDSERVE_K8S_E2E=1 go test -tags
// k8se2e -count=1 -timeout 30m -v -run 'TestK8sE2ERegions$'
// ./internal/k8se2e/. TestK8sE2E runs the same step after the elastic
// pool's.
func TestK8sE2ERegions(t *testing.T) {
	if os.Getenv("PDSERVE_K8S_E2E") != "1" {
		t.Skip("the chart's end-to-end test needs the cluster of make k8s-up: run with PDSERVE_K8S_E2E=1")
	}
	e := newEnv(t)
	e.regionsCleanup(t)
	start := time.Now()
	e.sh(t, docCommands["images"])
	e.vars["REGISTRY"] = imageRegistry(t, filepath.Join(e.repo, "bin", "images", "coordinator.tar"))
	t.Logf("images built and imported in %v, registry %s", time.Since(start).Round(time.Second), e.vars["REGISTRY"])
	t.Cleanup(func() {
		if os.Getenv("PDSERVE_K8S_E2E_KEEP") == "" {
			e.regionsCleanup(t)
		}
	})
	e.regions(t)
}

// regionsCleanup removes the regions' releases and namespaces (also
// from a Cleanup, after the test's context is done).
func (e *env) regionsCleanup(t *testing.T) {
	for _, r := range e2eRegions {
		e.trySh(fmt.Sprintf("helm uninstall %s -n %s --wait --timeout 3m", regionRel, r.ns))
		err := e.cs.CoreV1().Namespaces().Delete(context.Background(), r.ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete namespace %s: %v", r.ns, err)
		}
	}
	for _, r := range e2eRegions {
		waitFor(t, "namespace "+r.ns+" gone", 3*time.Minute, func() error {
			if _, err := e.cs.CoreV1().Namespaces().Get(context.Background(), r.ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
}

// regions installs two regions with helm/pdserve/ci/k8s-e2e-regions-values.yaml
// and a region block each: one CA (made here, as docs/regions.md's step 1
// does with openssl), a certificate per region naming its forwarding and
// gateway Services, each region's Secret, each listing the other's
// gateway as peer. It checks:
//   - each coordinator learns the other region through the NATS gateways
//     (pdserve_region_peers 1);
//   - the forwarding Service reaches the coordinator's mutual-TLS
//     listener: the other region's certificate is let in, no certificate
//     and one of another CA are not;
//   - with both pools up, a request to us-east is served in us-east;
//   - with us-east's prefill and decode Deployments scaled to 0, every
//     request to us-east, streamed or not, is answered 200 by eu-west
//     (X-PDServe-Region, the budget's region and origin_region), and
//     us-east counts them as forwards served.
func (e *env) regions(t *testing.T) {
	ca := tlstest.NewCA(t, "pdserve-regions-ca")
	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	// The values files' directory: not t.TempDir(), whose name follows the
	// subtest's, which may hold a comma, and helm -f splits at commas.
	dir, err := os.MkdirTemp("", "pdserve-k8se2e-regions-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pairs := map[string]tlstest.Pair{}
	for i, r := range e2eRegions {
		other := e2eRegions[1-i]
		pair := ca.Issue(t, tlstest.Leaf{DNSNames: []string{r.forwardHost(), r.gatewayHost()}})
		pairs[r.name] = pair
		crt, err := os.ReadFile(pair.CertFile)
		if err != nil {
			t.Fatal(err)
		}
		key, err := os.ReadFile(pair.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.cs.CoreV1().Secrets(r.ns).Create(t.Context(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: regionTLSSecret},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": caPEM},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		values := filepath.Join(dir, r.name+"-values.yaml")
		tlstest.WriteFile(t, values, fmt.Appendf(nil, `region:
  name: %s
  advertiseURL: https://%s:%d
  tlsSecret: %s
  gateway:
    port: %d
    peers:
      - name: %s
        url: nats://%s:%d
`, r.name, r.forwardHost(), regionPort, regionTLSSecret, regionGWPort, other.name, other.gatewayHost(), regionGWPort))
		e.sh(t, fmt.Sprintf(`helm install %s helm/pdserve -n %s -f helm/pdserve/ci/k8s-e2e-regions-values.yaml -f '%s' --set image.registry="$REGISTRY"`,
			regionRel, r.ns, values))
	}
	start := time.Now()
	for _, r := range e2eRegions {
		waitFor(t, "every pod of "+r.name+" Ready", 5*time.Minute, func() error { return e.podsReady(t.Context(), r.ns, regionRel) })
	}
	t.Logf("measure: both regions installed and Ready in %.1f s", time.Since(start).Seconds())

	base := map[string]string{}
	for _, r := range e2eRegions {
		base[r.name] = e.serviceURL(t, r.ns, regionRel+"-pdserve-coordinator")
	}
	start = time.Now()
	for _, r := range e2eRegions {
		waitFor(t, r.name+" learning the other region over the gateways", 2*time.Minute, func() error {
			m, err := get(base[r.name] + "/metrics")
			if err != nil {
				return err
			}
			if v := metric(m, "pdserve_region_peers "); v != 1 {
				return fmt.Errorf("pdserve_region_peers %v, want 1", v)
			}
			return nil
		})
	}
	t.Logf("measure: both coordinators counted the other region %.1f s after Ready", time.Since(start).Seconds())

	e.regionListener(t, e2eRegions[1], pairs[e2eRegions[0].name], caPEM)

	east, west := e2eRegions[0], e2eRegions[1]
	model := firstModel(t, base[east.name], "")
	if r := regionChat(t, base[east.name], model, false); r.status != http.StatusOK || r.served != "" && r.served != east.name {
		t.Fatalf("us-east with its pools up: %d, served by %q, want 200 served here: %s", r.status, r.served, r.body)
	}

	// us-east loses its pool.
	e.sh(t, fmt.Sprintf("kubectl -n %s scale deployment %s-pdserve-prefill %s-pdserve-decode --replicas=0", east.ns, regionRel, regionRel))
	waitFor(t, "us-east's workers gone", 3*time.Minute, func() error {
		pods, err := e.cs.CoreV1().Pods(east.ns).List(t.Context(), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/instance=" + regionRel + ",app.kubernetes.io/component in (prefill,decode)"})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d worker pods left, terminating ones included", len(pods.Items))
		}
		return nil
	})
	// Until the coordinator has seen the workers go (their last
	// heartbeats age out), a request may still be placed there and then
	// retried elsewhere; every answer must be a 200 all the same.
	var first time.Time
	waitFor(t, "a request to us-east served by eu-west", 2*time.Minute, func() error {
		r := regionChat(t, base[east.name], model, false)
		if r.status != http.StatusOK {
			t.Fatalf("us-east without its pool: %d: %s", r.status, r.body)
		}
		if r.served != west.name {
			return fmt.Errorf("served by %q", r.served)
		}
		first = time.Now()
		return nil
	})
	const n = 4
	for i := range n {
		r := regionChat(t, base[east.name], model, i%2 == 1)
		if r.status != http.StatusOK || r.served != west.name || r.region != west.name || r.origin != east.name {
			t.Errorf("request %d (stream %v) to us-east without its pool: %d, X-PDServe-Region %q, budget region %q origin %q; want 200 from eu-west, origin us-east: %s",
				i, i%2 == 1, r.status, r.served, r.region, r.origin, r.body)
		}
	}
	m, err := get(base[east.name] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v := metric(m, `pdserve_region_forwards_total{outcome="served",region="eu-west"} `); v < n+1 {
		t.Errorf("us-east's pdserve_region_forwards_total{served, eu-west} %v, want at least %d", v, n+1)
	}
	t.Logf("measure: us-east's pool scaled to 0: forwarding to eu-west from %s on, %d more requests all served there", first.Format(time.TimeOnly), n)
}

// regionListener: the forwarding Service of r, dialed from the host at its
// cluster IP with r's server name, lets a client with a certificate of the
// region CA (peer, another region's) through to the coordinator's HTTP
// handler, and refuses one with no certificate or with one of another CA
// in the TLS handshake. (The handler answers a GET /v1/models from a peer
// with 404: peers forward only completions; any HTTP answer shows the
// handshake passed.)
func (e *env) regionListener(t *testing.T, r e2eRegion, peer tlstest.Pair, caPEM []byte) {
	t.Helper()
	svc, err := e.cs.CoreV1().Services(r.ns).Get(t.Context(), regionRel+"-pdserve-coordinator-region", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(regionPort))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	stranger := tlstest.NewCA(t, "not-the-regions-ca").Issue(t, tlstest.Leaf{DNSNames: []string{"intruder.example.com"}})
	try := func(pair *tlstest.Pair) (string, error) {
		cfg := &tls.Config{RootCAs: roots, ServerName: r.forwardHost(), MinVersion: tls.VersionTLS12}
		if pair != nil {
			c, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
			if err != nil {
				t.Fatal(err)
			}
			// Presented whatever CAs the server names (Go's client
			// would otherwise send no certificate another CA signed).
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
		}
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		defer client.CloseIdleConnections()
		resp, err := client.Get("https://" + addr + "/v1/models")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return resp.Status + ": " + strings.TrimSpace(string(b)), nil
	}
	waitFor(t, r.name+"'s forwarding Service "+addr+" answering a peer's certificate", time.Minute, func() error {
		answer, err := try(&peer)
		if err == nil {
			t.Logf("a peer's certificate: the handler answered %s", answer)
		}
		return err
	})
	for what, pair := range map[string]*tlstest.Pair{"no client certificate": nil, "a certificate of another CA": &stranger} {
		if answer, err := try(pair); err == nil {
			t.Errorf("%s's forwarding listener let in a client with %s: %s", r.name, what, answer)
		} else {
			t.Logf("%s: refused: %v", what, err)
		}
	}
}

// regionAnswer is a chat completion's status, the region its response
// names (X-PDServe-Region), its budget's region and origin_region, and
// its body.
type regionAnswer struct {
	status                 int
	served, region, origin string
	body                   string
}

// regionChat sends a greedy chat completion of 8 tokens, streamed or not,
// and reads its answer; for a stream, the budget is the last chunk's.
func regionChat(t *testing.T, base, model string, stream bool) regionAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": stream, "temperature": 0, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	a := regionAnswer{status: resp.StatusCode, served: resp.Header.Get("X-PDServe-Region"), body: string(b)}
	var budget struct {
		PDServe *struct {
			Region       string `json:"region"`
			OriginRegion string `json:"origin_region"`
		} `json:"pdserve"`
	}
	parse := func(s string) {
		if json.Unmarshal([]byte(s), &budget) == nil && budget.PDServe != nil {
			a.region, a.origin = budget.PDServe.Region, budget.PDServe.OriginRegion
		}
	}
	if !stream {
		parse(a.body)
		return a
	}
	if a.status == http.StatusOK && !strings.Contains(a.body, "data: [DONE]") {
		a.status = -1 // a stream that did not end
	}
	for _, line := range strings.Split(a.body, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			parse(data)
		}
	}
	return a
}
