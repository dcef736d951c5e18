//go:build k8se2e

package k8se2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pdserve/pdserve/pkg/control"
	"github.com/pdserve/pdserve/pkg/planner/actuator"
)

// elasticRel is the release of the elastic pool step.
const elasticRel = "el"

// TestK8sE2EElastic runs the elastic pool step alone, on the cluster of
// make k8s-up with the images of make images (imported as TestK8sE2E
// does): PDSERVE_K8S_E2E=1 go test -tags k8se2e -count=1 -timeout 30m -v -run
// 'TestK8sE2EElastic$' ./internal/k8se2e/. TestK8sE2E runs the same step
// after the planner's.
func TestK8sE2EElastic(t *testing.T) {
	if os.Getenv("PDSERVE_K8S_E2E") != "1" {
		t.Skip("the chart's end-to-end test needs the cluster of make k8s-up: run with PDSERVE_K8S_E2E=1")
	}
	e := newEnv(t)
	e.trySh(fmt.Sprintf("helm uninstall %s -n %s --wait --timeout 3m", elasticRel, namespace))
	start := time.Now()
	e.sh(t, docCommands["images"])
	e.vars["REGISTRY"] = imageRegistry(t, filepath.Join(e.repo, "bin", "images", "coordinator.tar"))
	t.Logf("images built and imported in %v, registry %s", time.Since(start).Round(time.Second), e.vars["REGISTRY"])
	e.trySh("kubectl create namespace " + namespace)
	t.Cleanup(func() {
		if os.Getenv("PDSERVE_K8S_E2E_KEEP") == "" {
			e.trySh(fmt.Sprintf("helm uninstall %s -n %s --wait --timeout 3m", elasticRel, namespace))
		}
	})
	e.elastic(t)
}

// elastic installs ci/k8s-e2e-elastic-values.yaml (one fixed prefill, one
// fixed decode and one elastic worker that starts as prefill), checks the
// coordinator's Role allows pod patch and nothing more, then, under a
// load of streamed completions, moves the elastic worker to decode with
// a role command on its command subject as the coordinator's NATS user,
// and checks: its pod's role label becomes decode (the coordinator's
// --planner-pod-labels), the decode Service's endpoints now hold it and
// the prefill Service's no longer do, the coordinator routes decode work
// to it (a completion names it as decode worker), it is the same pod
// (not restarted or replaced), and no request in flight was lost.
func (e *env) elastic(t *testing.T) {
	e.sh(t, `helm install `+elasticRel+` helm/pdserve -n pdserve -f helm/pdserve/ci/k8s-e2e-elastic-values.yaml --set image.registry="$REGISTRY"`)
	waitFor(t, "every pod of "+elasticRel+" Ready", 5*time.Minute, func() error { return e.podsReady(t.Context(), namespace, elasticRel) })

	sa := "system:serviceaccount:" + namespace + ":" + elasticRel + "-pdserve-coordinator"
	for q, want := range map[string]bool{
		"patch pods": true, "get pods": false, "list pods": false, "update pods": false, "delete pods": false,
		"patch pods -n default": false, "patch deployments": false, "update deployments/scale": false,
	} {
		ns := "-n " + namespace
		if strings.Contains(q, " -n ") {
			ns = ""
		}
		out, _ := e.trySh(fmt.Sprintf("kubectl auth can-i %s %s --as=%s", q, ns, sa))
		if got := strings.TrimSpace(out) == "yes"; got != want {
			t.Errorf("kubectl auth can-i %s: %q, want allowed=%v", q, strings.TrimSpace(out), want)
		}
	}

	elastic := func() []string {
		pods, err := e.cs.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/instance=" + elasticRel + "," + actuator.PoolLabel + "=" + actuator.ElasticPool})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				names = append(names, p.Name+"/"+string(p.UID)+"/"+p.Labels[actuator.RoleLabel]+"/"+p.Status.PodIP)
			}
		}
		return names
	}
	pods := elastic()
	if len(pods) != 1 {
		t.Fatalf("elastic pods %v, want 1", pods)
	}
	parts := strings.Split(pods[0], "/")
	pod, uid, podIP := parts[0], parts[1], parts[3]
	if parts[2] != "prefill" {
		t.Fatalf("elastic pod %s starts with role label %q, want prefill", pod, parts[2])
	}
	inService := func(svc string) bool {
		eps, err := e.cs.DiscoveryV1().EndpointSlices(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range eps.Items {
			for _, ep := range s.Endpoints {
				for _, a := range ep.Addresses {
					if a == podIP && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
						return true
					}
				}
			}
		}
		return false
	}
	prefillSvc, decodeSvc := elasticRel+"-pdserve-prefill", elasticRel+"-pdserve-decode"
	waitFor(t, "the elastic pod in the prefill Service", time.Minute, func() error {
		if !inService(prefillSvc) || inService(decodeSvc) {
			return fmt.Errorf("in %s: %v, in %s: %v", prefillSvc, inService(prefillSvc), decodeSvc, inService(decodeSvc))
		}
		return nil
	})

	base := e.serviceURL(t, namespace, elasticRel+"-pdserve-coordinator")
	model := firstModel(t, base, "")
	load := startLoadPrompt(base, "", model, longPrompt, 4, 64)
	var once sync.Once
	endLoad := func() { once.Do(load.end) }
	defer endLoad()
	waitFor(t, "the load served by the fixed decode worker", 2*time.Minute, func() error {
		load.mu.Lock()
		defer load.mu.Unlock()
		if load.done == 0 {
			return fmt.Errorf("no completion yet (refused %d: %v)", load.refused, load.refusedErrs)
		}
		return nil
	})

	// The role command, as the coordinator's user, on the NATS Service
	// reached from the host through kube-proxy.
	svc, err := e.cs.CoreV1().Services(namespace).Get(t.Context(), elasticRel+"-pdserve-nats", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var port int32
	for _, p := range svc.Spec.Ports {
		if p.Port == 4222 || p.Name == "client" {
			port = p.Port
		}
	}
	password := e.secretValue(t, namespace, elasticRel+"-pdserve-nats-auth", "coordinator.password")
	nc, err := nats.Connect("nats://"+net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(port)), nats.UserInfo("coordinator", password), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatalf("NATS as the coordinator's user: %v", err)
	}
	defer nc.Close()
	moved := time.Now()
	e.moveRole(t, nc, pod, control.Command{Kind: control.CmdRole, Arg: string(control.RoleDecode)}, control.RolePrefill)
	labeled := time.Now()
	waitFor(t, "the elastic pod in the decode Service, out of the prefill one", time.Minute, func() error {
		if inService(prefillSvc) || !inService(decodeSvc) {
			return fmt.Errorf("in %s: %v, in %s: %v", prefillSvc, inService(prefillSvc), decodeSvc, inService(decodeSvc))
		}
		return nil
	})
	var served time.Time
	waitFor(t, "the coordinator routing decode work to the moved worker", 3*time.Minute, func() error {
		at, ok := load.firstServed(pod)
		if !ok {
			return fmt.Errorf("%s has served no completion as decode worker yet", pod)
		}
		served = at
		return nil
	})
	t.Logf("measure: role command to %s's label decode: %.1f s; to its first completion as decode worker (a 64-token stream): %.1f s",
		pod, labeled.Sub(moved).Seconds(), served.Sub(moved).Seconds())
	endLoad()
	if load.lost > 0 {
		t.Errorf("%d requests lost mid-stream across the role change: %v", load.lost, load.lostErrs)
	}
	t.Logf("load: %d done, %d refused before a token, %d lost", load.done, load.refused, load.lost)
	after := elastic()
	if len(after) != 1 || !strings.HasPrefix(after[0], pod+"/"+uid+"/decode/") {
		t.Errorf("elastic pods after the move %v, want %s (uid %s) relabeled decode, not replaced", after, pod, uid)
	}
	p, err := e.cs.CoreV1().Pods(namespace).Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.RestartCount > 0 {
			t.Errorf("%s/%s restarted %d times", pod, c.Name, c.RestartCount)
		}
	}
	e.elasticMigratesOut(t, base, model, nc, pod)
}

// elasticMigratesOut moves elastic worker pod, decoding, back to prefill
// with its running sequences migrated (the planner's role command), under
// a load of long streams, once it decodes at least one of them. Its
// sequences move, KV included, to the fixed decode worker, which pulls
// their KV off the elastic worker: with the chart's TLS and gRPC tokens
// the decode pool's certificate and its prefill token grant the pull.
// Checks: the fixed decode worker counts only pulled migrations
// (pdserve_decode_migration_pulls_total), at least one, none computed;
// the pod's role label prefill; nothing lost.
func (e *env) elasticMigratesOut(t *testing.T, base, model string, nc *nats.Conn, pod string) {
	fixed := e.fixedPods(t, elasticRel, "decode")
	if len(fixed) != 1 {
		t.Fatalf("fixed decode pods %v, want 1", fixed)
	}
	load := startLoadPrompt(base, "", model, func(int) string { return prompt }, 6, 400)
	var once sync.Once
	endLoad := func() { once.Do(load.end) }
	defer endLoad()
	waitFor(t, "the elastic worker decoding a sequence", 2*time.Minute, func() error {
		m, err := e.podMetrics(t, pod)
		if err != nil {
			return err
		}
		if n := metric(m, "pdserve_decode_running "); n < 1 {
			return fmt.Errorf("pdserve_decode_running %v", n)
		}
		return nil
	})
	e.moveRole(t, nc, pod, control.Command{Kind: control.CmdRole, Arg: string(control.RolePrefill), Migrate: true}, control.RoleDecode)
	var pulled, computed float64
	waitFor(t, "the fixed decode worker's migration pulls", time.Minute, func() error {
		m, err := e.podMetrics(t, fixed[0])
		if err != nil {
			return err
		}
		pulled = max(metric(m, `pdserve_decode_migration_pulls_total{result="pulled"} `), 0)
		computed = max(metric(m, `pdserve_decode_migration_pulls_total{result="computed"} `), 0)
		if pulled+computed < 1 {
			return errors.New("no migrated sequence continued there yet")
		}
		return nil
	})
	endLoad()
	t.Logf("migrated off %s to %s: %v pulled, %v computed; load: %d done, %d refused before a token, %d lost",
		pod, fixed[0], pulled, computed, load.done, load.refused, load.lost)
	if computed != 0 || pulled < 1 {
		t.Errorf("fixed decode worker's migrations: %v pulled, %v computed; want every one pulled", pulled, computed)
	}
	if load.lost > 0 {
		t.Errorf("%d requests lost mid-stream across the migration: %v", load.lost, load.lostErrs)
	}
}

// moveRole sends role command c to elastic worker pod, now of role from,
// on its command subject as the coordinator's NATS user (nc), and waits
// for the pod's role label to become c.Arg.
func (e *env) moveRole(t *testing.T, nc *nats.Conn, pod string, c control.Command, from control.Role) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	err := control.SendCommand(ctx, nc, string(from), pod, c)
	cancel()
	if err != nil {
		t.Fatalf("role command to %s: %v", pod, err)
	}
	waitFor(t, "the elastic pod's role label "+c.Arg, 2*time.Minute, func() error {
		p, err := e.cs.CoreV1().Pods(namespace).Get(t.Context(), pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := p.Labels[actuator.RoleLabel]; got != c.Arg {
			return fmt.Errorf("%s=%q", actuator.RoleLabel, got)
		}
		return nil
	})
}

// fixedPods returns the names of release rel's pods of role (the
// app.kubernetes.io/component label) outside the elastic pool.
func (e *env) fixedPods(t *testing.T, rel, role string) []string {
	t.Helper()
	return e.podNames(t, namespace, "app.kubernetes.io/instance="+rel+","+actuator.RoleLabel+"="+role+",!"+actuator.PoolLabel)
}

// podMetrics returns pod's /metrics, from its container port "metrics"
// at its pod IP (the node reaches pod IPs).
func (e *env) podMetrics(t *testing.T, pod string) (string, error) {
	p, err := e.cs.CoreV1().Pods(namespace).Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "metrics" {
				return get(fmt.Sprintf("http://%s/metrics", net.JoinHostPort(p.Status.PodIP, fmt.Sprint(port.ContainerPort))))
			}
		}
	}
	return "", fmt.Errorf("pod %s has no container port metrics", pod)
}
