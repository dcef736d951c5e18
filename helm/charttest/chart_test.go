package charttest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/pdserve/pdserve/pkg/config"
	"github.com/pdserve/pdserve/pkg/perfmodel"
	"github.com/pdserve/pdserve/pkg/planner/actuator"
)

// gpuResources are the GPU resource names of the device plugins the chart
// documents for gpuResource; a container requests at most the release's.
var gpuResources = []corev1.ResourceName{"nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe"}

// gpuResource is the resource the release's workers request GPUs as.
func (r release) gpuResource() corev1.ResourceName {
	s, _ := r.value("gpuResource").(string)
	return corev1.ResourceName(s)
}

// Object names the chart promises (the planner's Kubernetes actuator and
// docs/kubernetes.md rely on them).
var (
	coordinatorName = releaseName + "-pdserve-coordinator"
	prefillName     = releaseName + "-pdserve-prefill"
	decodeName      = releaseName + "-pdserve-decode"
	natsName        = releaseName + "-pdserve-nats"
)

// pool is one pdserve workload of the chart and where its values live.
type pool struct {
	deployment string // Deployment name
	container  string // container (and binary) name
	values     string // values key, e.g. prefillWorker
}

func pools(r release) []pool {
	out := []pool{{coordinatorName, "coordinator", "coordinator"}, {decodeName, "decode-worker", "decodeWorker"}}
	if r.value("coordinator.mode") == "disaggregated" {
		out = append(out, pool{prefillName, "prefill-worker", "prefillWorker"})
	}
	return out
}

// container returns the named container of spec or fails.
func container(t *testing.T, spec *corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// TestChart renders the chart for every values set and checks the result.
func TestChart(t *testing.T) {
	for _, vs := range valuesSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			r := render(t, vs)
			t.Run("names", func(t *testing.T) { checkNames(t, r) })
			t.Run("selectors", func(t *testing.T) { checkSelectors(t, r) })
			t.Run("pods", func(t *testing.T) { checkPods(t, r) })
			t.Run("placement", func(t *testing.T) { checkPlacement(t, vs, r) })
			t.Run("gpus", func(t *testing.T) { checkGPUs(t, r) })
			t.Run("flags", func(t *testing.T) { checkFlags(t, r) })
			t.Run("listen", func(t *testing.T) { checkListen(t, r) })
			t.Run("policy", func(t *testing.T) { checkPolicy(t, r) })
			t.Run("planner", func(t *testing.T) { checkPlanner(t, r) })
			t.Run("nats", func(t *testing.T) { checkNATS(t, r) })
			t.Run("grpc-tokens", func(t *testing.T) { checkGRPCTokens(t, r) })
			t.Run("certificates", func(t *testing.T) { checkCertificates(t, r) })
			t.Run("networkpolicies", func(t *testing.T) { checkNetworkPolicies(t, r) })
			t.Run("llamacpp", func(t *testing.T) { checkLlamacpp(t, r) })
			t.Run("notes", func(t *testing.T) { checkNotes(t, r) })
		})
	}
}

// checkNames: the Deployments exist under their promised names, and every
// object name is a valid DNS name (Services: a DNS label).
func checkNames(t *testing.T, r release) {
	for _, p := range pools(r) {
		r.deployment(t, p.deployment)
	}
	if r.value("coordinator.mode") == "colocated" && r.find("Deployment", prefillName) != nil {
		t.Errorf("colocated mode renders a prefill Deployment")
	}
	for _, o := range r.objects {
		errs := validation.IsDNS1123Subdomain(o.name)
		if o.kind == "Service" {
			errs = validation.IsDNS1123Label(o.name)
		}
		if len(errs) > 0 {
			t.Errorf("%s %s: %s", o.kind, o.name, strings.Join(errs, "; "))
		}
	}
}

// checkSelectors: Deployments select their own pods and only them; every
// Service, PDB and monitor selects the pods it is meant for.
func checkSelectors(t *testing.T, r release) {
	podLabels := map[string]labels.Set{}
	for _, o := range r.all("Deployment") {
		d := o.obj.(*appsv1.Deployment)
		sel := labels.SelectorFromSet(d.Spec.Selector.MatchLabels)
		if len(d.Spec.Selector.MatchExpressions) > 0 {
			t.Errorf("Deployment %s: matchExpressions in its selector", o.name)
		}
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("Deployment %s: selector %v does not match its pod labels %v", o.name, sel, d.Spec.Template.Labels)
		}
		podLabels[o.name] = d.Spec.Template.Labels
	}
	for name, ls := range podLabels {
		for other, ols := range podLabels {
			d := r.find("Deployment", name).(*appsv1.Deployment)
			// The fixed pools' selectors match an elastic pod by its role
			// label, which is how their Services follow it; their
			// ReplicaSets (pod-template-hash) never adopt it.
			if other == elasticName && (name == prefillName || name == decodeName) {
				continue
			}
			if other != name && labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(ols) {
				t.Errorf("Deployment %s's selector also matches the pods of %s", name, other)
			}
		}
		for k, v := range ls {
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("Deployment %s: label %s=%q: %s", name, k, v, strings.Join(errs, "; "))
			}
		}
	}
	selects := func(sel labels.Selector) []string {
		var out []string
		for name, ls := range podLabels {
			if sel.Matches(ls) {
				out = append(out, name)
			}
		}
		sort.Strings(out)
		return out
	}
	for _, o := range r.all("Service") {
		s := o.obj.(*corev1.Service)
		// An elastic pod is in the Service of its live role
		// (TestElasticPool); here, of the role it starts in.
		got := slices.DeleteFunc(selects(labels.SelectorFromSet(s.Spec.Selector)), func(n string) bool { return n == elasticName })
		if diff := cmp.Diff([]string{o.name}, got); diff != "" {
			t.Errorf("Service %s selects the pods of %v, want its own Deployment's (-want +got):\n%s", o.name, got, diff)
		}
		d, ok := r.find("Deployment", o.name).(*appsv1.Deployment)
		if !ok {
			t.Errorf("Service %s has no Deployment of its name", o.name)
			continue
		}
		for _, sp := range s.Spec.Ports {
			if sp.TargetPort.StrVal == "" || !hasPort(d.Spec.Template.Spec, sp.TargetPort.StrVal) {
				t.Errorf("Service %s: port %s targets %q, not a named port of its pods", o.name, sp.Name, sp.TargetPort.String())
			}
		}
	}
	for _, o := range r.all("PodDisruptionBudget") {
		p := o.obj.(*policyv1.PodDisruptionBudget)
		sel := mustSelector(t, p.Spec.Selector.MatchLabels, p.Spec.Selector.MatchExpressions)
		if got := selects(sel); len(got) != 1 || got[0] != o.name {
			t.Errorf("PodDisruptionBudget %s selects %v, want [%s]", o.name, got, o.name)
		}
	}
	for _, o := range r.all("ServiceMonitor") {
		sm := o.obj.(*serviceMonitor)
		want := map[string]bool{coordinatorName: true, decodeName: true}
		if r.value("coordinator.mode") == "disaggregated" {
			want[prefillName] = true
		}
		sel := mustSelector(t, sm.Spec.Selector.MatchLabels, sm.Spec.Selector.MatchExpressions)
		for _, so := range r.all("Service") {
			s := so.obj.(*corev1.Service)
			if sel.Matches(labels.Set(s.Labels)) != want[so.name] {
				t.Errorf("ServiceMonitor selects Service %s: %v, want %v", so.name, !want[so.name], want[so.name])
			}
		}
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port != "http" && ep.Port != "metrics" {
				t.Errorf("ServiceMonitor endpoint port %q", ep.Port)
			}
		}
	}
	for _, o := range r.all("PodMonitor") {
		pm := o.obj.(*podMonitor)
		sel := mustSelector(t, pm.Spec.Selector.MatchLabels, pm.Spec.Selector.MatchExpressions)
		for _, p := range pools(r) {
			if !sel.Matches(podLabels[p.deployment]) {
				t.Errorf("PodMonitor does not select the pods of %s", p.deployment)
			}
		}
		if bundled, _ := r.value("nats.bundled").(bool); bundled && sel.Matches(podLabels[natsName]) {
			t.Errorf("PodMonitor selects the NATS pods, which have no pdserve metrics")
		}
	}
}

func hasPort(spec corev1.PodSpec, name string) bool {
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// checkPods: security settings, probes on named ports, volumes that exist,
// and references to ConfigMaps and Secrets that the release creates or the
// values name as existing.
func checkPods(t *testing.T, r release) {
	existing := map[string]bool{} // Secrets the user provides
	for _, path := range []string{"tls.existingSecret", "apiKeys.existingSecret", "nats.external.existingSecret", "nats.auth.existingSecret", "model.download.tokenSecret.name", "test.apiKeySecret"} {
		if s, _ := r.value(path).(string); s != "" {
			existing[s] = true
		}
	}
	for _, s := range r.providedSecrets() {
		existing[s] = true
	}
	for name, spec := range r.podSpecs() {
		sc := spec.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
			t.Errorf("%s: pod may run as root: %+v", name, sc)
		}
		vols := map[string]corev1.Volume{}
		for _, v := range spec.Volumes {
			vols[v.Name] = v
			switch {
			case v.ConfigMap != nil && r.find("ConfigMap", v.ConfigMap.Name) == nil:
				t.Errorf("%s: volume %s: no ConfigMap %s in the release", name, v.Name, v.ConfigMap.Name)
			case v.Secret != nil && r.find("Secret", v.Secret.SecretName) == nil && !existing[v.Secret.SecretName]:
				t.Errorf("%s: volume %s: Secret %s neither in the release nor named in values", name, v.Name, v.Secret.SecretName)
			}
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			where := name + "/" + c.Name
			cs := c.SecurityContext
			if cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem ||
				cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation ||
				cs.Capabilities == nil || !containsCap(cs.Capabilities.Drop, "ALL") {
				t.Errorf("%s: want read-only root, no privilege escalation, all capabilities dropped: %+v", where, cs)
			}
			for _, m := range c.VolumeMounts {
				if _, ok := vols[m.Name]; !ok {
					t.Errorf("%s: mounts undefined volume %s", where, m.Name)
				}
			}
			for _, e := range c.Env {
				if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
					if n := ref.SecretKeyRef.Name; r.find("Secret", n) == nil && !existing[n] {
						t.Errorf("%s: env %s from Secret %s, neither in the release nor named in values", where, e.Name, n)
					}
				}
			}
			if strings.HasPrefix(name, "Pod/") || slices.ContainsFunc(spec.InitContainers, func(ic corev1.Container) bool { return ic.Name == c.Name }) {
				continue // the helm test pod and init containers run once, without probes
			}
			for probeName, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
				if p == nil || p.HTTPGet == nil {
					t.Errorf("%s: no HTTP %s probe", where, probeName)
					continue
				}
				if !hasPort(corev1.PodSpec{Containers: []corev1.Container{c}}, p.HTTPGet.Port.StrVal) {
					t.Errorf("%s: %s probe on %q, not a named port of the container", where, probeName, p.HTTPGet.Port.String())
				}
			}
			if c.Name != "nats" {
				if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
					t.Errorf("%s: liveness probe path %q, want /healthz", where, c.LivenessProbe.HTTPGet.Path)
				}
				if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
					t.Errorf("%s: readiness probe path %q, want /readyz", where, c.ReadinessProbe.HTTPGet.Path)
				}
			}
		}
	}
	// Graceful termination: the pdserve pods get what values ask for.
	for _, p := range pools(r) {
		d := r.deployment(t, p.deployment)
		want := r.intValue(t, p.values+".terminationGracePeriodSeconds")
		if got := d.Spec.Template.Spec.TerminationGracePeriodSeconds; got == nil || *got != want {
			t.Errorf("%s: terminationGracePeriodSeconds %v, want %d", p.deployment, got, want)
		}
	}
}

func containsCap(caps []corev1.Capability, want corev1.Capability) bool {
	for _, c := range caps {
		if c == want {
			return true
		}
	}
	return false
}

// wantPlacement lists, per values set, node labels each pool must select
// and taints it must tolerate: stated here rather than read back from the
// values, so that a template that ignores them fails.
var wantPlacement = map[string]map[string]struct {
	nodeSelector map[string]string
	tolerate     []string // key=value pairs
	notTolerate  []string
}{
	"gpu-two-pools": twoGPUPools,
	"llamacpp-gpu":  twoGPUPools,
	"production":    twoGPUPools,
}

// twoGPUPools: each pool selects its own nodes and tolerates their taints
// as docs/kubernetes.md sets them, and the device plugin's GPU taint.
var twoGPUPools = map[string]struct {
	nodeSelector map[string]string
	tolerate     []string
	notTolerate  []string
}{
	prefillName: {map[string]string{"pdserve.io/pool": "prefill"}, []string{"pdserve.io/pool=prefill", "nvidia.com/gpu=present"}, []string{"pdserve.io/pool=decode"}},
	decodeName:  {map[string]string{"pdserve.io/pool": "decode"}, []string{"pdserve.io/pool=decode", "nvidia.com/gpu=present"}, []string{"pdserve.io/pool=prefill"}},
}

// nodeLabels are the node labels docs/kubernetes.md tells users to create,
// with their values; a nodeSelector may name these and the well-known
// kubernetes.io labels, nothing that the docs leave the user to guess.
var nodeLabels = map[string][]string{"pdserve.io/pool": {"prefill", "decode"}}

// checkPlacement: each pool's pods carry exactly the node selector,
// tolerations and affinity of its own values, and in gpu-two-pools land
// on their own pool.
func checkPlacement(t *testing.T, vs valuesSet, r release) {
	for _, p := range pools(r) {
		spec := r.deployment(t, p.deployment).Spec.Template.Spec
		var ns map[string]string
		convert(t, r.table(p.values+".nodeSelector"), &ns)
		var tol []corev1.Toleration
		convert(t, r.value(p.values+".tolerations"), &tol)
		var aff *corev1.Affinity
		if a := r.table(p.values + ".affinity"); len(a) > 0 {
			convert(t, a, &aff)
		}
		opts := cmpopts.EquateEmpty()
		if diff := cmp.Diff(ns, spec.NodeSelector, opts); diff != "" {
			t.Errorf("%s nodeSelector (-values +rendered):\n%s", p.deployment, diff)
		}
		if diff := cmp.Diff(tol, spec.Tolerations, opts); diff != "" {
			t.Errorf("%s tolerations (-values +rendered):\n%s", p.deployment, diff)
		}
		if diff := cmp.Diff(aff, spec.Affinity, opts); diff != "" {
			t.Errorf("%s affinity (-values +rendered):\n%s", p.deployment, diff)
		}
		for k, v := range spec.NodeSelector {
			if vals, ok := nodeLabels[k]; ok && !slices.Contains(vals, v) || !ok && !strings.Contains(k, "kubernetes.io/") {
				t.Errorf("%s: nodeSelector %s=%s, a label docs/kubernetes.md does not create", p.deployment, k, v)
			}
		}
		if ts, _ := r.value(p.values + ".topologySpread.enabled").(bool); ts {
			own := labels.SelectorFromSet(r.deployment(t, p.deployment).Spec.Selector.MatchLabels).String()
			found := false
			for _, c := range spec.TopologySpreadConstraints {
				if c.LabelSelector != nil && labels.SelectorFromSet(c.LabelSelector.MatchLabels).String() == own {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: topology spread enabled but no constraint on its own pods", p.deployment)
			}
		}
	}
	for name, want := range wantPlacement[vs.name] {
		spec := r.deployment(t, name).Spec.Template.Spec
		for k, v := range want.nodeSelector {
			if spec.NodeSelector[k] != v {
				t.Errorf("%s: nodeSelector %v, want %s=%s", name, spec.NodeSelector, k, v)
			}
		}
		tolerates := func(kv string) bool {
			k, v, _ := strings.Cut(kv, "=")
			taint := corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffectNoSchedule}
			for _, tol := range spec.Tolerations {
				if tol.ToleratesTaint(klog.Background(), &taint, false) {
					return true
				}
			}
			return false
		}
		for _, kv := range want.tolerate {
			if !tolerates(kv) {
				t.Errorf("%s does not tolerate %s:NoSchedule", name, kv)
			}
		}
		for _, kv := range want.notTolerate {
			if tolerates(kv) {
				t.Errorf("%s tolerates the other pool's taint %s:NoSchedule", name, kv)
			}
		}
	}
}

// checkGPUs: the release's gpuResource is requested (and limited,
// equally) by the worker containers whose pool asks for GPUs, and by
// nothing else; no container requests another vendor's GPUs.
func checkGPUs(t *testing.T, r release) {
	gpuResource := r.gpuResource()
	if !slices.Contains(gpuResources, gpuResource) {
		t.Fatalf("gpuResource %q is none of %v", gpuResource, gpuResources)
	}
	want := map[string]int64{} // "<pod>/<container>" → GPUs
	for _, p := range pools(r) {
		if p.values != "coordinator" {
			want["Deployment/"+p.deployment+"/"+p.container] = r.intValue(t, p.values+".gpus")
		}
	}
	if on, _ := r.value("elastic.enabled").(bool); on {
		want["Deployment/"+elasticName+"/"+elasticBinary(r)] = r.intValue(t, "elastic.gpus")
	}
	for name, spec := range r.podSpecs() {
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			where := name + "/" + c.Name
			for _, other := range gpuResources {
				_, inLim := c.Resources.Limits[other]
				_, inReq := c.Resources.Requests[other]
				if other != gpuResource && (inLim || inReq) {
					t.Errorf("%s: requests %s, but gpuResource is %s", where, other, gpuResource)
				}
			}
			lim, hasLim := c.Resources.Limits[gpuResource]
			req, hasReq := c.Resources.Requests[gpuResource]
			n := want[where]
			if n == 0 {
				if hasLim || hasReq {
					t.Errorf("%s: requests %s (limit %v, request %v), want none", where, gpuResource, lim.String(), req.String())
				}
				continue
			}
			wantQ := *resource.NewQuantity(n, resource.DecimalSI)
			if !hasLim || lim.Cmp(wantQ) != 0 || !hasReq || req.Cmp(wantQ) != 0 {
				t.Errorf("%s: %s limit %v request %v, want %d", where, gpuResource, lim.String(), req.String(), n)
			}
		}
	}
}

// checkFlags: every flag given to a pdserve container is one its binary
// defines (parsed by the binary's own flag set), the options it yields are
// valid (TLS files: those of a sample of the user's Secret), the ports in
// flags are the container's named ports, and with tls.enabled every
// pdserve container gets the TLS flags (one plaintext component could talk
// to no other).
func checkFlags(t *testing.T, r release) {
	tls, _ := r.value("tls.enabled").(bool)
	for name, spec := range r.podSpecs() {
		for _, c := range spec.Containers {
			newFlags, ok := binaries[c.Name]
			if !ok {
				continue // nats, the helm test pod
			}
			where := name + "/" + c.Name
			args, err := expandArgs(c)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			files := r.mounts(t, spec, c)
			if cfg := r.value("apiKeys.existingSecret"); c.Name == "coordinator" && cfg != "" {
				// The policy file is in the user's Secret: check the
				// flags with the built-in policy instead.
				files = mountedFiles{}
				args = slices.DeleteFunc(slices.Clone(args), func(a string) bool { return strings.HasPrefix(a, "--policy=") })
			}
			values, invalid, err := checkArgs(newFlags, args, files, t.TempDir())
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if invalid != nil {
				t.Errorf("%s: %s", where, invalid)
			}
			if values["engine"] == "sim" {
				checkProfile(t, r, where, c, values["profile"])
			}
			checkTLSFlags(t, r, where, tls, values)
			checkDrain(t, where, spec, c, values)
			for flagName, port := range map[string]string{"grpc-addr": "grpc", "advertise-addr": "grpc", "metrics-addr": "metrics", "http-addr": "http"} {
				addr, ok := values[flagName]
				if !ok {
					continue
				}
				_, p, err := net.SplitHostPort(addr)
				if err != nil {
					t.Errorf("%s: --%s=%s: %v", where, flagName, addr, err)
					continue
				}
				if got := containerPort(c, port); fmt.Sprint(got) != p {
					t.Errorf("%s: --%s=%s, but container port %s is %d", where, flagName, addr, port, got)
				}
			}
		}
	}
}

// checkTLSFlags: with TLS, a container has every TLS flag and verifies
// tls.serverName; without, none.
func checkTLSFlags(t *testing.T, r release, where string, tls bool, values map[string]string) {
	t.Helper()
	for _, f := range []string{"tls-cert", "tls-key", "tls-ca", "tls-server-name"} {
		if _, ok := values[f]; ok != tls {
			t.Errorf("%s: tls.enabled=%v, but --%s given: %v", where, tls, f, ok)
		}
	}
	if want := r.value("tls.serverName"); tls && values["tls-server-name"] != want {
		t.Errorf("%s: --tls-server-name=%s, want tls.serverName %v", where, values["tls-server-name"], want)
	}
}

// checkDrain: the binary's graceful drain (--drain-timeout of a worker,
// --shutdown-timeout of the coordinator) ends before the kubelet kills the
// pod: preStop sleep + drain < terminationGracePeriodSeconds.
func checkDrain(t *testing.T, where string, spec *corev1.PodSpec, c corev1.Container, values map[string]string) {
	t.Helper()
	v, ok := values["drain-timeout"]
	if !ok {
		v, ok = values["shutdown-timeout"]
	}
	if !ok {
		t.Errorf("%s: no --drain-timeout or --shutdown-timeout: the binary's default may outlast the grace period", where)
		return
	}
	drain, err := time.ParseDuration(v)
	if err != nil {
		t.Errorf("%s: drain timeout %q: %v", where, v, err)
		return
	}
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	if preStop+drain >= grace {
		t.Errorf("%s: preStop %v + drain %v ≥ grace period %v", where, preStop, drain, grace)
	}
}

// checkProfile: a sim engine's profile is one the performance model knows,
// and a worker with GPUs has as many as the profile's tensor-parallel
// degree.
func checkProfile(t *testing.T, r release, where string, c corev1.Container, name string) {
	t.Helper()
	p, err := perfmodel.Load(name)
	if err != nil {
		t.Errorf("%s: --profile: %v", where, err)
		return
	}
	gpus := c.Resources.Limits[r.gpuResource()]
	if n := gpus.Value(); n > 0 && n != int64(p.TP) {
		t.Errorf("%s: %d GPUs per pod, but profile %s is tensor parallel %d", where, n, name, p.TP)
	}
}

func containerPort(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// policyFile returns the coordinator's policy file as mounted: from the
// ConfigMap, or from the chart's Secret when API keys are configured; ""
// with ok=false when it comes from a Secret the user provides.
func policyFile(t *testing.T, r release) (string, bool) {
	t.Helper()
	cm, ok := r.find("ConfigMap", coordinatorName).(*corev1.ConfigMap)
	if !ok {
		t.Fatalf("no ConfigMap %s", coordinatorName)
	}
	if p, ok := cm.Data["policy.yaml"]; ok {
		return p, true
	}
	if s, ok := r.find("Secret", releaseName+"-pdserve-policy").(*corev1.Secret); ok {
		return s.StringData[r.value("apiKeys.secretKey").(string)], true
	}
	return "", false
}

// checkPolicy: the policy file the coordinator reads parses with the
// coordinator's own loader, and API keys never appear in a ConfigMap.
func checkPolicy(t *testing.T, r release) {
	p, ok := policyFile(t, r)
	if !ok {
		if r.value("apiKeys.existingSecret") == "" {
			t.Fatal("no policy file in the release")
		}
		return
	}
	pol, err := config.Parse([]byte(p))
	if err != nil {
		t.Fatalf("policy.yaml does not load: %v\n%s", err, p)
	}
	keys := r.table("apiKeys.keys")
	if len(pol.Budgets.APIKeys) != len(keys) {
		t.Errorf("policy has %d API keys, values %d", len(pol.Budgets.APIKeys), len(keys))
	}
	for k := range keys {
		for _, o := range r.all("ConfigMap") {
			for file, data := range o.obj.(*corev1.ConfigMap).Data {
				if strings.Contains(data, k) {
					t.Errorf("API key %q… appears in ConfigMap %s/%s", k[:4], o.name, file)
				}
			}
		}
	}
	if want := r.intValue(t, "coordinator.policy.limits.queue_limit"); int64(pol.Limits.QueueLimit) != want {
		t.Errorf("policy queue_limit %d, values %d", pol.Limits.QueueLimit, want)
	}
}

// TestDefaultPolicyPrefixAware: the chart's defaults, disaggregated and
// colocated, give the coordinator the router's default weights:
// prefix-aware routing, prompts hashed in both modes.
func TestDefaultPolicyPrefixAware(t *testing.T) {
	for _, vs := range []valuesSet{{name: "defaults"}, {name: "colocated", file: filepath.Join(chartDir, "ci", "colocated-values.yaml")}} {
		t.Run(vs.name, func(t *testing.T) {
			r := render(t, vs)
			p, ok := policyFile(t, r)
			if !ok {
				t.Fatal("no policy file in the release")
			}
			pol, err := config.Parse([]byte(p))
			if err != nil {
				t.Fatalf("policy.yaml does not load: %v\n%s", err, p)
			}
			if got := pol.Routing.DecodeWeights(); got != config.DefaultDecodeWeights {
				t.Errorf("policy decode weights %+v, want the defaults %+v", got, config.DefaultDecodeWeights)
			}
			if got := pol.Routing.PrefillWeights(); got != config.DefaultPrefillWeights {
				t.Errorf("policy prefill weights %+v, want the defaults %+v", got, config.DefaultPrefillWeights)
			}
			if !pol.Routing.PrefixAware(r.value("coordinator.mode") == "colocated") {
				t.Error("the chart's default policy is not prefix-aware")
			}
		})
	}
}

// checkPlanner: the coordinator gets the planner's settings as flags: the
// mode the actuator asks for, the prefill pool's sim profile, and with the
// Kubernetes actuator the namespace and the two worker Deployments to
// scale. The RBAC for that actuator exists exactly when it is on, and
// grants what the actuator uses (actuator.RBACRules: get and update of
// deployments/scale on those two Deployments only, list of pods).
func checkPlanner(t *testing.T, r release) {
	coord := r.deployment(t, coordinatorName).Spec.Template.Spec
	args, err := expandArgs(container(t, &coord, "coordinator"))
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]string{}
	for _, a := range args {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		flags[name] = value
	}
	act := fmt.Sprint(r.value("coordinator.planner.actuator"))
	wantMode := map[string]string{"off": "off", "log": "auto", "kubernetes": "kubernetes"}[act]
	if got := flags["planner"]; got != wantMode {
		t.Errorf("actuator %s: --planner=%s, want %s", act, got, wantMode)
	}
	prefillEngine := mergedEngine(r, "prefillWorker")
	if act != "off" && r.value("coordinator.planner.profile") == nil && prefillEngine["type"] == "sim" {
		if got := flags["planner-profile"]; got != prefillEngine["profile"] {
			t.Errorf("--planner-profile=%s, want the prefill pool's profile %v", got, prefillEngine["profile"])
		}
	}
	actuate := act == "kubernetes"
	elastic, _ := r.value("elastic.enabled").(bool)
	for name, want := range map[string]string{"planner-prefill-deployment": prefillName, "planner-decode-deployment": decodeName} {
		got, ok := flags[name]
		if ok != actuate || (actuate && got != want) {
			t.Errorf("actuator %s: --%s=%q (given: %v), want %q only with the kubernetes actuator", act, name, got, ok, want)
		}
	}
	if got, ok := flags["planner-namespace"]; ok != (actuate || elastic) || (ok && got != namespace) {
		t.Errorf("actuator %s, elastic %v: --planner-namespace=%q (given: %v), want %q only with the kubernetes actuator or the elastic pool", act, elastic, got, ok, namespace)
	}
	for _, name := range []string{"planner-roles", "planner-pod-labels"} {
		if _, ok := flags[name]; ok != elastic {
			t.Errorf("--%s given: %v, want it only with the elastic pool (%v)", name, ok, elastic)
		}
	}
	// The coordinator's Roles: the planner's scaling (kubernetes
	// actuator), the elastic pods' role labels (elastic pool); each
	// exactly the actuator's rules, bound to the coordinator only.
	want := map[string][]rbacv1.PolicyRule{}
	if actuate {
		var rules []rbacv1.PolicyRule
		for _, rule := range actuator.RBACRules() {
			pr := rbacv1.PolicyRule{APIGroups: rule.APIGroups, Resources: rule.Resources, Verbs: rule.Verbs}
			if slices.Contains(rule.Resources, "deployments/scale") {
				pr.ResourceNames = []string{prefillName, decodeName} // list (pods) cannot be limited by name
			}
			rules = append(rules, pr)
		}
		want[releaseName+"-pdserve-planner"] = rules
	}
	if elastic {
		var rules []rbacv1.PolicyRule
		for _, rule := range actuator.LabelRBACRules() {
			rules = append(rules, rbacv1.PolicyRule{APIGroups: rule.APIGroups, Resources: rule.Resources, Verbs: rule.Verbs})
		}
		want[releaseName+"-pdserve-elastic-labels"] = rules
	}
	if mount := coord.AutomountServiceAccountToken; mount == nil || *mount != (len(want) > 0) {
		t.Errorf("coordinator automountServiceAccountToken = %v, want %v", mount, len(want) > 0)
	}
	got := map[string][]rbacv1.PolicyRule{}
	for _, o := range r.all("Role") {
		got[o.name] = o.obj.(*rbacv1.Role).Rules
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("Roles and their rules (-want +got):\n%s", diff)
	}
	bindings := r.all("RoleBinding")
	if len(bindings) != len(want) {
		t.Errorf("%d RoleBindings, want %d", len(bindings), len(want))
	}
	wantSubj := []rbacv1.Subject{{Kind: "ServiceAccount", Name: coord.ServiceAccountName, Namespace: namespace}}
	for _, o := range bindings {
		rb := o.obj.(*rbacv1.RoleBinding)
		if _, ok := want[rb.RoleRef.Name]; !ok || rb.RoleRef.Kind != "Role" {
			t.Errorf("RoleBinding %s binds %s %s, not a Role of the coordinator's", o.name, rb.RoleRef.Kind, rb.RoleRef.Name)
		}
		if diff := cmp.Diff(wantSubj, rb.Subjects); diff != "" {
			t.Errorf("RoleBinding %s does not bind the coordinator's ServiceAccount only: %s", o.name, diff)
		}
	}
	if len(want) > 0 && r.find("ServiceAccount", coord.ServiceAccountName) == nil {
		t.Errorf("coordinator ServiceAccount %s not in the release", coord.ServiceAccountName)
	}
}

// mergedEngine returns a pool's engine values: the top-level engine with
// the pool's own engine fields over it.
func mergedEngine(r release, pool string) map[string]any {
	e := map[string]any{}
	for k, v := range r.table("engine") {
		e[k] = v
	}
	for k, v := range r.table(pool + ".engine") {
		e[k] = v
	}
	return e
}

// checkNATS: every pdserve container gets NATS_URL, from the bundled
// server's Service or from the external URL or Secret.
func checkNATS(t *testing.T, r release) {
	bundled, _ := r.value("nats.bundled").(bool)
	if got := r.find("Deployment", natsName) != nil; got != bundled {
		t.Errorf("NATS Deployment rendered: %v, want %v", got, bundled)
	}
	for _, p := range pools(r) {
		c := container(t, &r.deployment(t, p.deployment).Spec.Template.Spec, p.container)
		var env *corev1.EnvVar
		for i := range c.Env {
			if c.Env[i].Name == "NATS_URL" {
				env = &c.Env[i]
			}
		}
		switch {
		case env == nil:
			t.Errorf("%s: no NATS_URL", p.deployment)
		case bundled:
			if want := "nats://" + natsName + ":4222"; env.Value != want {
				t.Errorf("%s: NATS_URL %q, want %q", p.deployment, env.Value, want)
			}
			svc, ok := r.find("Service", natsName).(*corev1.Service)
			if !ok || svc.Spec.Ports[0].Port != 4222 {
				t.Errorf("no NATS Service %s on port 4222", natsName)
			}
		case r.value("nats.external.existingSecret") != "":
			if env.ValueFrom == nil || env.ValueFrom.SecretKeyRef == nil || env.ValueFrom.SecretKeyRef.Name != r.value("nats.external.existingSecret") {
				t.Errorf("%s: NATS_URL %+v, want it from Secret %v", p.deployment, env, r.value("nats.external.existingSecret"))
			}
		default:
			if env.Value != r.value("nats.external.url") {
				t.Errorf("%s: NATS_URL %q, want %v", p.deployment, env.Value, r.value("nats.external.url"))
			}
		}
	}
}

// checkNotes: NOTES.txt tells how to reach the API and send a request.
func checkNotes(t *testing.T, r release) {
	for _, want := range []string{coordinatorName, "/v1/completions", "helm test"} {
		if !strings.Contains(r.notes, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, r.notes)
		}
	}
}

// TestSchemaRejectsBadValues: each file in helm/testdata/bad fails schema
// validation, as `helm install` would.
func TestSchemaRejectsBadValues(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(badDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no bad values files")
	}
	ch := loadChart(t)
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			_, err := renderValues(ch, f)
			if err == nil {
				t.Fatal("schema accepted the values")
			}
			if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
				t.Fatalf("error is not a schema error: %v", err)
			}
		})
	}
}

// TestLint runs Helm's linter for every values set; warnings fail too.
func TestLint(t *testing.T) {
	kv, err := chartutilKubeVersion()
	if err != nil {
		t.Fatal(err)
	}
	for _, vs := range valuesSets(t) {
		t.Run(vs.name, func(t *testing.T) {
			vals := map[string]any{}
			if vs.file != "" {
				b, err := os.ReadFile(vs.file)
				if err != nil {
					t.Fatal(err)
				}
				if err := yaml.Unmarshal(b, &vals); err != nil {
					t.Fatal(err)
				}
			}
			res := lint.AllWithKubeVersion(chartDir, vals, namespace, kv)
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("%s", m)
				}
			}
		})
	}
}

// TestBlockTokensOneValue: decodeWorker.blockTokens is the deployment's
// block size: the coordinator and the prefill workers get the same
// --block-tokens as the decode workers (the coordinator refuses a worker
// whose heartbeat says another); unset, none gets the flag (all default
// to the same 16).
func TestBlockTokensOneValue(t *testing.T) {
	for over, want := range map[string]string{"{}": "", "decodeWorker: {blockTokens: 32}": "32"} {
		r := renderOver(t, "", over)
		for _, p := range pools(r) {
			got, ok := argMap(container(t, &r.deployment(t, p.deployment).Spec.Template.Spec, p.container).Args)["block-tokens"]
			if ok != (want != "") || got != want {
				t.Errorf("%s: %s: --block-tokens=%q (given %v), want %q", over, p.deployment, got, ok, want)
			}
		}
	}
}
