//go:build k8se2e

package k8se2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pdserve/pdserve/internal/repotest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// env is what every step uses: the repository, the tools on PATH (helm,
// kubectl, the repository's binaries), the cluster's client and the
// variables the documented commands read.
type env struct {
	repo  string
	tools string // helm, kubectl and the repository's binaries
	kube  string // kubeconfig
	cs    *kubernetes.Clientset
	vars  map[string]string // MODELS, REGISTRY, ... for the commands
}

// kubeconfigPath is $KUBECONFIG, else the admin kubeconfig make k8s-up
// writes into the repository's state directory.
func kubeconfigPath(repo string) string {
	if k := os.Getenv("KUBECONFIG"); k != "" {
		return k
	}
	return filepath.Join(repo, ".pdserve", "k8s", "kubeconfig", "admin.conf")
}

// kubectlPath is $KUBECTL, a kubectl on PATH, or the one make k8s-up
// built into its cache.
func kubectlPath() (string, error) {
	if k := os.Getenv("KUBECTL"); k != "" {
		return k, nil
	}
	if p, err := exec.LookPath("kubectl"); err == nil {
		return p, nil
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache")
	}
	found, _ := filepath.Glob(filepath.Join(cache, "pdserve", "k8s", "kubernetes-*", "bin", "kubectl"))
	if len(found) == 0 {
		return "", errors.New("no kubectl: set KUBECTL, put one on PATH, or run make k8s-up (which builds one)")
	}
	return found[len(found)-1], nil
}

// newEnv builds the tools and connects to the cluster; it fails the test
// when there is none.
func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{repo: repotest.Root(t), tools: t.TempDir(), vars: map[string]string{}}
	e.kube = kubeconfigPath(e.repo)
	if _, err := os.Stat(e.kube); err != nil {
		t.Fatalf("no cluster: kubeconfig %s: %v (run make k8s-up first)", e.kube, err)
	}
	kubectl, err := kubectlPath()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(kubectl, filepath.Join(e.tools, "kubectl")); err != nil {
		t.Fatal(err)
	}
	// helm is the version go.mod pins; coordinator and mkgguf for the
	// documented commands and the standalone server.
	start := time.Now()
	e.goBuild(t, "helm", "helm.sh/helm/v3/cmd/helm")
	e.goBuild(t, "coordinator", "./cmd/coordinator")
	e.goBuild(t, "mkgguf", "./cmd/mkgguf")
	t.Logf("built helm, coordinator, mkgguf in %v", time.Since(start).Round(time.Second))
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kube)
	if err != nil {
		t.Fatalf("kubeconfig: %v", err)
	}
	cfg.Timeout = 30 * time.Second
	if e.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	v, err := e.cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("no cluster: the API server at %s does not answer: %v (run make k8s-up first)", cfg.Host, err)
	}
	t.Logf("cluster: Kubernetes %s at %s", v.GitVersion, cfg.Host)
	return e
}

func (e *env) goBuild(t *testing.T, name, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", filepath.Join(e.tools, name), pkg)
	cmd.Dir = e.repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
}

// environ is the environment of the commands: PATH with the tools first,
// KUBECONFIG, and e.vars.
func (e *env) environ() []string {
	env := append(os.Environ(), "PATH="+e.tools+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+e.kube)
	for k, v := range e.vars {
		env = append(env, k+"="+v)
	}
	return env
}

// sh runs a script of documented commands with bash -euo pipefail in the
// repository and returns its standard output; a failure fails the test.
func (e *env) sh(t *testing.T, script string) string {
	t.Helper()
	out, err := e.trySh(script)
	if err != nil {
		t.Fatalf("%s\n%v", strings.TrimSpace(script), err)
	}
	return out
}

// trySh is sh returning the error (with the output) instead.
func (e *env) trySh(script string) (string, error) {
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = e.repo
	cmd.Env = e.environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("%w\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// waitFor polls f every second until it returns nil or d passes; the
// last error fails the test.
func waitFor(t *testing.T, what string, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(time.Second)
	}
}

// podsReady returns nil when every pod of the release instance in ns is
// Ready (and there is at least one), else what is not.
func (e *env) podsReady(ctx context.Context, ns, instance string) error {
	pods, err := e.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + instance + ",app.kubernetes.io/component!=test"})
	if err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		return errors.New("no pods yet")
	}
	var notReady []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || !podReady(&p) {
			notReady = append(notReady, fmt.Sprintf("%s (%s%s)", p.Name, p.Status.Phase, podWhy(&p)))
		}
	}
	if len(notReady) > 0 {
		return fmt.Errorf("not ready: %s", strings.Join(notReady, ", "))
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podWhy is the first waiting reason of a pod's containers, or its
// unscheduled condition, for messages.
func podWhy(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return ": " + c.Message
		}
	}
	for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := s.State.Waiting; w != nil && w.Reason != "" {
			return ": " + w.Reason + " " + w.Message
		}
		if s.RestartCount > 0 {
			return fmt.Sprintf(": %s restarted %d times", s.Name, s.RestartCount)
		}
	}
	return ""
}

// serviceURL returns http://CLUSTER-IP:PORT of a Service, reached from the
// host through kube-proxy's rules.
func (e *env) serviceURL(t *testing.T, ns, name string) string {
	t.Helper()
	svc, err := e.cs.CoreV1().Services(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := fmt.Sprintf("http://%s", net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svc.Spec.Ports[0].Port)))
	waitFor(t, "the Service "+name+" answers from the host at "+u, time.Minute, func() error {
		resp, err := http.Get(u + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	return u
}

// streamed is one streamed completion: its text, the decode worker that
// served it (the pdserve object of the last chunk), and whether it failed
// after it had started (a lost request) or before (refused).
type streamed struct {
	text, decodeWorker, finish string
	started                    bool
	err                        error
}

// streamChat sends a streamed, greedy chat completion and reads it to the
// end.
func streamChat(ctx context.Context, base, key, model, prompt string, maxTokens int) streamed {
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "temperature": 0, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return streamed{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamed{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return streamed{err: fmt.Errorf("%s: %s", resp.Status, b)}
	}
	var out streamed
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			PDServe *struct {
				DecodeWorker string `json:"decode_worker"`
			} `json:"pdserve"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			out.err = fmt.Errorf("chunk %q: %w", data, err)
			return out
		}
		if chunk.Error != nil {
			out.err = fmt.Errorf("error in the stream: %s", chunk.Error.Message)
			return out
		}
		for _, c := range chunk.Choices {
			out.started = true
			text.WriteString(c.Delta.Content)
			if c.FinishReason != nil {
				out.finish = *c.FinishReason
			}
		}
		if chunk.PDServe != nil && chunk.PDServe.DecodeWorker != "" {
			out.decodeWorker = chunk.PDServe.DecodeWorker
		}
	}
	out.text = text.String()
	switch {
	case sc.Err() != nil:
		out.err = sc.Err()
	case !done:
		out.err = errors.New("the stream ended without [DONE]")
	case out.finish == "":
		out.err = errors.New("no finish_reason")
	}
	return out
}

// firstModel is the first id of GET /v1/models.
func firstModel(t *testing.T, base, key string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/models", nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 {
		t.Fatalf("GET /v1/models: %s, %v", resp.Status, err)
	}
	return list.Data[0].ID
}

// freePort is a free TCP port on 127.0.0.1.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// metric returns the value of the first sample of a Prometheus text
// exposition whose line starts with prefix (name and labels), or -1.
func metric(text, prefix string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			var v float64
			if _, err := fmt.Sscan(strings.TrimSpace(line[len(prefix):]), &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// get returns the body of GET url.
func get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

// followed is the log of a container followed with kubectl logs -f until
// the container exits.
type followed struct {
	out  bytes.Buffer
	done chan struct{}
}

// wait returns the log once kubectl logs -f has ended (the container
// exited), or what it has after 30 s.
func (f *followed) wait() string {
	select {
	case <-f.done:
	case <-time.After(30 * time.Second):
	}
	return f.out.String()
}

// followLogs follows the log of pod's first container in the background;
// the test's end stops it.
func (e *env) followLogs(t *testing.T, ns, pod string) *followed {
	t.Helper()
	f := &followed{done: make(chan struct{})}
	cmd := exec.Command("kubectl", "-n", ns, "logs", "-f", pod)
	cmd.Env = e.environ()
	cmd.Path = filepath.Join(e.tools, "kubectl")
	cmd.Stdout = &f.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(f.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-f.done
	})
	return f
}
