//go:build k8se2e

package k8se2e

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Where the e2e installs, as docs/kubernetes.md does.
const (
	namespace    = "pdserve"
	gpuNamespace = "pdserve-gpu"
	release      = "pd"
	plannerRel   = "pl"
	gpuRel       = "pg"
	prompt       = "Name three colours."
)

// TestK8sE2E is the chart's end-to-end test (see the package doc).
func TestK8sE2E(t *testing.T) {
	if os.Getenv("PDSERVE_K8S_E2E") != "1" {
		t.Skip("the chart's end-to-end test needs the cluster of make k8s-up: run make k8s-e2e (PDSERVE_K8S_E2E=1)")
	}
	e := newEnv(t)
	models, err := os.MkdirTemp("", "pdserve-k8se2e-models-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(models) })
	// The pods run as uid 65532 and read the model through the hostPath.
	if err := os.Chmod(models, 0o755); err != nil {
		t.Fatal(err)
	}
	e.vars["MODELS"] = models
	e.cleanup(t)
	t.Cleanup(func() {
		if os.Getenv("PDSERVE_K8S_E2E_KEEP") == "" {
			e.cleanup(t)
		}
	})

	start := time.Now()
	e.sh(t, docCommands["images"])
	e.vars["REGISTRY"] = imageRegistry(t, filepath.Join(e.repo, "bin", "images", "coordinator.tar"))
	t.Logf("images built and imported in %v, registry %s", time.Since(start).Round(time.Second), e.vars["REGISTRY"])
	e.sh(t, docCommands["model"])
	e.sh(t, docCommands["secrets"])
	key := e.secretValue(t, namespace, "pdserve-test-key", "api-key")

	var base, model string
	ok := t.Run("install, every pod Ready", func(t *testing.T) {
		start := time.Now()
		e.sh(t, docCommands["install"])
		waitFor(t, "every pod of "+release+" Ready", 10*time.Minute, func() error { return e.podsReady(t.Context(), namespace, release) })
		t.Logf("measure: helm install to all pods Ready: %.1f s", time.Since(start).Seconds())
	}) && t.Run("helm test", func(t *testing.T) {
		if out := e.sh(t, docCommands["test"]); !strings.Contains(out, "PASS") {
			t.Errorf("helm test printed no PASS:\n%s", out)
		}
	}) && t.Run("streamed chat through the Service equals the standalone server", func(t *testing.T) {
		base = e.serviceURL(t, namespace, release+"-pdserve-coordinator")
		model = firstModel(t, base, key)
		got := streamChat(t.Context(), base, key, model, prompt, 24)
		if got.err != nil {
			t.Fatalf("through the Service: %v", got.err)
		}
		if r := streamChat(t.Context(), base, "", model, prompt, 4); r.err == nil || !strings.Contains(r.err.Error(), "401") {
			t.Errorf("without a key: %v, want 401", r.err)
		}
		want := e.standalone(t, filepath.Join(models, "tiny-llama.gguf"), model)
		t.Logf("cluster: %q (decode worker %s); standalone: %q", got.text, got.decodeWorker, want)
		if got.text != want {
			t.Errorf("greedy text through the cluster %q, standalone %q", got.text, want)
		}
	}) && t.Run("mutual TLS with the chart's certificates: every worker admitted verified", func(t *testing.T) {
		e.verifiedWorkers(t)
	}) && t.Run("helm upgrade keeps the Secrets and rolls the workers under load", func(t *testing.T) {
		e.upgrade(t, base, key, model)
	})
	ok = ok && t.Run("helm uninstall leaves what the docs list", func(t *testing.T) { e.uninstall(t) })
	ok = ok && t.Run("planner: RBAC, scale up and down", func(t *testing.T) { e.planner(t) })
	ok = ok && t.Run("elastic pool: a pod's role, label and routing change under load", func(t *testing.T) { e.elastic(t) })
	ok = ok && t.Run("two regions: federated over the gateways, forwarding over mutual TLS when one loses its pool", func(t *testing.T) { e.regions(t) })
	t.Run("production layout on the kwok GPU nodes", func(t *testing.T) { e.gpuLayout(t) })
}

// cleanup removes what an earlier run left: the releases and namespaces.
func (e *env) cleanup(t *testing.T) {
	e.regionsCleanup(t)
	for _, r := range [][2]string{{release, namespace}, {plannerRel, namespace}, {elasticRel, namespace}, {gpuRel, gpuNamespace}} {
		e.trySh(fmt.Sprintf("helm uninstall %s -n %s --wait --timeout 3m", r[0], r[1]))
	}
	if err := e.cs.NodeV1().RuntimeClasses().Delete(context.Background(), "nvidia", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("delete RuntimeClass nvidia: %v", err)
	}
	for _, ns := range []string{namespace, gpuNamespace} {
		err := e.cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete namespace %s: %v", ns, err)
			continue
		}
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) {
			if _, err := e.cs.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				break
			}
			time.Sleep(time.Second)
		}
	}
}

// imageRegistry reads the reference an image tarball of make images was
// written with (its index's io.containerd.image.name or
// org.opencontainers.image.ref.name annotation) and returns the part
// before /coordinator:TAG, the chart's image.registry for it.
func imageRegistry(t *testing.T, tarball string) string {
	t.Helper()
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatalf("make images wrote no coordinator image: %v", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			t.Fatal(err)
		}
		for _, m := range idx.Manifests {
			for _, k := range []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"} {
				if ref := m.Annotations[k]; strings.Contains(ref, "/coordinator:") {
					return ref[:strings.LastIndex(ref, "/coordinator:")]
				}
			}
		}
	}
	t.Fatalf("%s: no reference …/coordinator:TAG in index.json", tarball)
	return ""
}

// secretValue reads one key of a Secret.
func (e *env) secretValue(t *testing.T, ns, name, key string) string {
	t.Helper()
	s, err := e.cs.CoreV1().Secrets(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(s.Data[key])
}

// standalone runs the standalone server on the same model file with the
// same llama.cpp settings as the release and returns its greedy reply.
func (e *env) standalone(t *testing.T, file, model string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(filepath.Join(e.tools, "coordinator"), "--standalone", "--http-addr", addr,
		"--engine", "llamacpp", "--model", file, "--gpu-layers", "0", "--ctx-size", "2048", "--kv-type", "f16",
		"--max-seqs", "4", "--engine-threads", "1")
	cmd.Dir = e.repo
	cmd.Env = append(os.Environ(), "PDSERVE_LLAMA_LIB="+filepath.Join(e.repo, "third_party", "llama", "lib"))
	log, err := os.Create(filepath.Join(t.TempDir(), "standalone.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	base := "http://" + addr
	waitFor(t, "the standalone server Ready", 2*time.Minute, func() error { _, err := get(base + "/readyz"); return err })
	r := streamChat(t.Context(), base, "", firstModel(t, base, ""), prompt, 24)
	if r.err != nil {
		b, _ := os.ReadFile(log.Name())
		t.Fatalf("standalone: %v\n%s", r.err, b)
	}
	return r.text
}

// verifiedWorkers: with the chart's defaults (TLS on, its own CA and a
// certificate per role) the coordinator admitted each running worker pod
// after its handshake proved the certificate's role, and none unverified.
func (e *env) verifiedWorkers(t *testing.T) {
	coord := e.workerPods(t, namespace, release, "coordinator")
	if len(coord) != 1 {
		t.Fatalf("coordinator pods %v, want one", coord)
	}
	workers := append(e.workerPods(t, namespace, release, "prefill"), e.workerPods(t, namespace, release, "decode")...)
	if len(workers) == 0 {
		t.Fatal("no worker pods: nothing to check")
	}
	var log string
	waitFor(t, "the coordinator's log to admit every worker verified", time.Minute, func() error {
		log = e.sh(t, "kubectl -n "+namespace+" logs "+coord[0])
		for _, w := range workers {
			if !slices.ContainsFunc(strings.Split(log, "\n"), func(l string) bool {
				return strings.Contains(l, "worker admitted: certificate verified") && strings.Contains(l, `"worker":"`+w+`"`)
			}) {
				return fmt.Errorf("no verified admission of %s", w)
			}
		}
		return nil
	})
	if strings.Contains(log, "admitted unverified") {
		t.Errorf("the coordinator admitted a worker unverified:\n%s", log)
	}
	secrets := e.releaseSecrets(t, namespace, release)
	for _, role := range []string{"coordinator", "prefill", "decode"} {
		if _, ok := secrets[release+"-pdserve-"+role+"-tls"]; !ok {
			t.Errorf("no generated TLS Secret for %s among %v", role, slices.Sorted(maps.Keys(secrets)))
		}
	}
}

// releaseSecrets returns the data of the Secrets the chart generated for
// a release (gRPC tokens, NATS passwords, TLS certificates), by name.
func (e *env) releaseSecrets(t *testing.T, ns, rel string) map[string]map[string][]byte {
	t.Helper()
	list, err := e.cs.CoreV1().Secrets(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + rel})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]byte{}
	for _, s := range list.Items {
		if (s.Type != corev1.SecretTypeOpaque && s.Type != corev1.SecretTypeTLS) || strings.HasPrefix(s.Name, "sh.helm.release") {
			continue
		}
		out[s.Name] = s.Data
	}
	return out
}

// workerPods are the names of the running worker pods of a release.
func (e *env) workerPods(t *testing.T, ns, rel, component string) []string {
	t.Helper()
	return e.podNames(t, ns, "app.kubernetes.io/instance="+rel+",app.kubernetes.io/component="+component)
}

// podNames returns the sorted names of namespace ns's pods that label
// selector sel selects and that are not being deleted.
func (e *env) podNames(t *testing.T, ns, sel string) []string {
	t.Helper()
	pods, err := e.cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	slices.Sort(names)
	return names
}

// load streams requests back to back (conc at once) until stop, and
// counts them: done (complete), refused (failed before a token: no worker
// could take it then, e.g. during a roll with one worker per pool) and
// lost (failed after its first token: a request in flight dropped).
type load struct {
	mu                    sync.Mutex
	done, refused, lost   int
	lostErrs, refusedErrs []string
	served                map[string]time.Time // decode worker → first completion
	stop                  chan struct{}
	wg                    sync.WaitGroup
}

// startLoad is startLoadPrompt with the e2e's short prompt, the same for
// every request.
func startLoad(base, key, model string, conc, maxTokens int) *load {
	return startLoadPrompt(base, key, model, func(int) string { return prompt }, conc, maxTokens)
}

// startLoadPrompt starts conc streams, maxTokens each, back to back; the
// i-th request (counted over all streams from 0) sends text(i).
func startLoadPrompt(base, key, model string, text func(i int) string, conc, maxTokens int) *load {
	l := &load{stop: make(chan struct{}), served: map[string]time.Time{}}
	var sent atomic.Int64
	for range conc {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				r := streamChat(ctx, base, key, model, text(int(sent.Add(1)-1)), maxTokens)
				cancel()
				l.mu.Lock()
				switch {
				case r.err == nil:
					l.done++
					if _, ok := l.served[r.decodeWorker]; !ok {
						l.served[r.decodeWorker] = time.Now()
					}
				case r.started:
					l.lost++
					l.lostErrs = append(l.lostErrs, r.err.Error())
				default:
					l.refused++
					if len(l.refusedErrs) < 5 {
						l.refusedErrs = append(l.refusedErrs, r.err.Error())
					}
					time.Sleep(time.Second)
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

func (l *load) end() {
	close(l.stop)
	l.wg.Wait()
}

func (l *load) firstServed(worker string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.served[worker]
	return at, ok
}

func (e *env) upgrade(t *testing.T, base, key, model string) {
	before := e.releaseSecrets(t, namespace, release)
	if len(before) < 5 {
		t.Fatalf("generated Secrets %v, want the gRPC tokens, the NATS passwords and three TLS certificates", slices.Sorted(maps.Keys(before)))
	}
	oldPods := append(e.workerPods(t, namespace, release, "prefill"), e.workerPods(t, namespace, release, "decode")...)
	l := startLoad(base, key, model, 2, 400)
	start := time.Now()
	e.sh(t, docCommands["upgrade"])
	// helm --wait is content once a Deployment has replicas − maxUnavailable
	// ready pods (0 of 1 here): it returns while the old pods still drain.
	// The load goes on until every old pod is gone and every pod Ready.
	waitFor(t, "the workers rolled", 5*time.Minute, func() error {
		for _, c := range []string{"prefill", "decode"} {
			for _, p := range e.workerPods(t, namespace, release, c) {
				if slices.Contains(oldPods, p) {
					return fmt.Errorf("%s not replaced yet", p)
				}
			}
		}
		return e.podsReady(t.Context(), namespace, release)
	})
	roll := time.Since(start)
	// A last stretch under load on the new pods.
	time.Sleep(5 * time.Second)
	l.end()
	t.Logf("upgrade rolled the workers in %.1f s under load: %d requests complete, %d refused before their first token %q, %d lost",
		roll.Seconds(), l.done, l.refused, l.refusedErrs, l.lost)
	if l.lost > 0 {
		t.Errorf("%d requests in flight lost during the roll: %q", l.lost, l.lostErrs)
	}
	if l.done == 0 {
		t.Error("no request completed during the upgrade")
	}
	newPods := append(e.workerPods(t, namespace, release, "prefill"), e.workerPods(t, namespace, release, "decode")...)
	for _, p := range oldPods {
		if slices.Contains(newPods, p) {
			t.Errorf("worker pod %s survived the upgrade: the workers were not rolled", p)
		}
	}
	after := e.releaseSecrets(t, namespace, release)
	for name, data := range before {
		if !maps.EqualFunc(data, after[name], func(a, b []byte) bool { return string(a) == string(b) }) {
			t.Errorf("Secret %s changed on upgrade (lookup did not keep it)", name)
		}
	}
	if err := e.podsReady(t.Context(), namespace, release); err != nil {
		t.Error(err)
	}
}

// leftAfterUninstall are the objects docs/kubernetes.md says helm
// uninstall leaves in the namespace ("What helm uninstall leaves"): the
// Secrets you created, and the last helm test pod (a test hook, which
// Helm keeps until the next helm test or until you delete it).
var leftAfterUninstall = []string{
	"Pod/pd-pdserve-test-completion",
	"Secret/pdserve-api-keys",
	"Secret/pdserve-test-key",
}

func (e *env) uninstall(t *testing.T) {
	e.sh(t, docCommands["uninstall"])
	// Pods and what the namespace controllers make go asynchronously.
	var left []string
	waitFor(t, "helm uninstall to leave only what the docs list", 3*time.Minute, func() error {
		left = e.namespaceObjects(t, namespace)
		var extra []string
		for _, o := range left {
			if !slices.Contains(leftAfterUninstall, o) {
				extra = append(extra, o)
			}
		}
		if len(extra) > 0 {
			return fmt.Errorf("left behind: %s", strings.Join(extra, ", "))
		}
		return nil
	})
	t.Logf("helm uninstall left: %s", strings.Join(left, ", "))
	e.trySh("kubectl -n pdserve delete pod pd-pdserve-test-completion --ignore-not-found")
}

// namespaceObjects lists every namespaced object in ns as Kind/name,
// through kubectl api-resources (every listable kind the server has),
// without what Kubernetes itself puts in every namespace.
func (e *env) namespaceObjects(t *testing.T, ns string) []string {
	t.Helper()
	kinds := strings.Fields(e.sh(t, "kubectl api-resources --namespaced --verbs=list -o name"))
	var skip = []string{"events", "events.events.k8s.io"}
	kinds = slices.DeleteFunc(kinds, func(k string) bool { return slices.Contains(skip, k) })
	out := e.sh(t, fmt.Sprintf("kubectl -n %s get %s --ignore-not-found -o go-template='{{range .items}}{{.kind}}/{{.metadata.name}}{{\"\\n\"}}{{end}}'", ns, strings.Join(kinds, ",")))
	var objs []string
	for _, o := range strings.Fields(out) {
		switch o {
		case "ConfigMap/kube-root-ca.crt", "ServiceAccount/default":
			continue
		}
		objs = append(objs, o)
	}
	slices.Sort(objs)
	return objs
}
