package charttest

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/pdserve/pdserve/pkg/planner/actuator"
)

// elasticName is the elastic pool's Deployment (elastic.enabled).
var elasticName = releaseName + "-pdserve-elastic"

// elasticBinary is the elastic pool's container (and binary): its
// starting role's worker.
func elasticBinary(r release) string {
	return r.value("elastic.initialRole").(string) + "-worker"
}

// elasticPodAs returns the labels of an elastic pod after the coordinator
// set its role label to role.
func elasticPodAs(d *appsv1.Deployment, role string) labels.Set {
	ls := maps.Clone(d.Spec.Template.Labels)
	ls[actuator.RoleLabel] = role
	return ls
}

// TestElasticPool renders the elastic pool, starting as decode (ci
// elastic-values.yaml) and as prefill, and checks what its role changes
// rely on: the Deployment selects its pods by actuator.PoolLabel, not by
// the role label the coordinator patches (else a relabeled pod would be
// orphaned and replaced); its pods start with their role's label, run
// their role's binary with --elastic; the prefill and decode Services
// select an elastic pod by its live role label, and only then; exactly
// one PodDisruptionBudget covers it (two would block its eviction); it
// requests its GPUs; and the coordinator moves and relabels it.
func TestElasticPool(t *testing.T) {
	for _, initial := range []string{"decode", "prefill"} {
		t.Run(initial, func(t *testing.T) {
			r := renderOver(t, "elastic", "elastic: {initialRole: "+initial+"}")
			d := r.deployment(t, elasticName)
			wantSel := map[string]string{"app.kubernetes.io/name": "pdserve", "app.kubernetes.io/instance": releaseName, actuator.PoolLabel: actuator.ElasticPool}
			if diff := cmp.Diff(wantSel, d.Spec.Selector.MatchLabels); diff != "" {
				t.Errorf("selector (-want +got):\n%s", diff)
			}
			if got := d.Spec.Template.Labels[actuator.RoleLabel]; got != initial {
				t.Errorf("pod role label %q, want the initial role %s", got, initial)
			}
			if got := *d.Spec.Replicas; got != 4 {
				t.Errorf("replicas %d, want elastic.replicas 4", got)
			}
			c := container(t, &d.Spec.Template.Spec, initial+"-worker")
			args := argMap(c.Args)
			if args["elastic"] != "true" {
				t.Errorf("args %q lack --elastic", c.Args)
			}
			if role, ok := args["role"]; (initial == "decode") != ok || (ok && role != "decode") {
				t.Errorf("--role=%q (given %v) with initial role %s", role, ok, initial)
			}
			if !strings.HasSuffix(strings.Split(c.Image, ":")[0], "/"+initial+"-worker") {
				t.Errorf("image %s, want the %s worker's", c.Image, initial)
			}
			gpu := c.Resources.Limits[r.gpuResource()]
			if gpu.Value() != 1 {
				t.Errorf("GPU limit %v, want elastic.gpus 1", gpu.String())
			}
			if r.find("Service", elasticName) != nil {
				t.Errorf("a Service of the elastic pool: its pods are in their live role's Service (a second one would scrape them twice)")
			}
			for _, role := range []string{"prefill", "decode"} {
				pod := elasticPodAs(d, role)
				for _, svc := range []string{prefillName, decodeName} {
					s := r.find("Service", svc).(*corev1.Service)
					want := strings.HasSuffix(svc, "-"+role)
					if got := labels.SelectorFromSet(s.Spec.Selector).Matches(pod); got != want {
						t.Errorf("elastic pod as %s: selected by Service %s %v, want %v", role, svc, got, want)
					}
				}
				var pdbs []string
				for _, o := range r.all("PodDisruptionBudget") {
					p := o.obj.(*policyv1.PodDisruptionBudget)
					if mustSelector(t, p.Spec.Selector.MatchLabels, p.Spec.Selector.MatchExpressions).Matches(pod) {
						pdbs = append(pdbs, o.name)
					}
				}
				if diff := cmp.Diff([]string{elasticName}, pdbs); diff != "" {
					t.Errorf("elastic pod as %s: budgets (-want +got):\n%s", role, diff)
				}
			}
			// The fixed pools' budgets still cover their own pods.
			for _, name := range []string{prefillName, decodeName} {
				p := r.find("PodDisruptionBudget", name).(*policyv1.PodDisruptionBudget)
				if !mustSelector(t, p.Spec.Selector.MatchLabels, p.Spec.Selector.MatchExpressions).Matches(labels.Set(r.deployment(t, name).Spec.Template.Labels)) {
					t.Errorf("PodDisruptionBudget %s no longer selects its pool's pods", name)
				}
			}
			coord := r.deployment(t, coordinatorName).Spec.Template.Spec
			cargs := argMap(container(t, &coord, "coordinator").Args)
			for _, f := range []string{"planner-roles", "planner-pod-labels"} {
				if cargs[f] != "true" {
					t.Errorf("coordinator lacks --%s", f)
				}
			}
			if cargs["planner-namespace"] != namespace {
				t.Errorf("coordinator --planner-namespace=%q, want %s", cargs["planner-namespace"], namespace)
			}
		})
	}
}

// TestElasticRefusals: the elastic pool refuses, with a message naming
// what to change, the settings it cannot serve, and TLS identities that
// would not tell its certificate apart.
func TestElasticRefusals(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct{ name, values, want string }{
		{"colocated mode", "coordinator: {mode: colocated}\ndecodeWorker: {role: colocated}\ntls: {enabled: false}", "elastic.enabled needs coordinator.mode=disaggregated"},
		{"planner off", "coordinator: {planner: {actuator: 'off'}}\ntls: {enabled: false}", "elastic.enabled needs the planner"},
		{"identities without the elastic one", "tls: {roleSecrets: {coordinator: c, prefill: p, decode: d, elastic: e}, identities: {coordinator: c.example.org, prefill: p.example.org}}",
			"tls.identities.elastic is required"},
		{"identities without the elastic Secret", "tls: {roleSecrets: {coordinator: c, prefill: p, decode: d}, identities: {coordinator: c.example.org, prefill: p.example.org, elastic: e.example.org}}",
			"tls.roleSecrets.elastic is required"},
		{"the elastic identity is the prefill one", "tls: {identities: {prefill: p.example.org, elastic: p.example.org}}", "tls.identities.elastic must differ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := renderError(t, ch, "elastic: {enabled: true}\n"+tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// elasticFlows are the flows an elastic pool adds (ci/elastic-values.yaml
// with its pods relabeled to either role): KV both ways within the pool,
// whatever the roles' labels say; from the prefill pool; to and from the
// decode pool (pushes, migration pulls); the coordinator's calls; NATS
// and DNS; and the API server for the role labels (here an ipBlock).
var elasticFlows = func() []string {
	out := []string{"coordinator → internet:https"}
	for _, e := range []string{"elastic(prefill)", "elastic(decode)"} {
		out = append(out, "coordinator → "+e+":grpc", "prefill → "+e+":grpc", "decode → "+e+":grpc",
			e+" → decode:grpc", e+" → kube-dns:dns", e+" → kube-dns:dns-tcp", e+" → nats:client")
		for _, peer := range []string{"elastic(prefill)", "elastic(decode)"} {
			out = append(out, e+" → "+peer+":grpc")
		}
	}
	return out
}()

// TestElasticPolicySelection: each elastic pod is isolated by the
// elastic pool's NetworkPolicy and by that of its live role only.
func TestElasticPolicySelection(t *testing.T) {
	r := render(t, valuesSet{name: "elastic", file: chartDir + "/ci/elastic-values.yaml"})
	d := r.deployment(t, elasticName)
	for _, role := range []string{"prefill", "decode"} {
		var by []string
		for _, o := range r.all("NetworkPolicy") {
			np := o.obj.(*networkingv1.NetworkPolicy)
			if mustSelector(t, np.Spec.PodSelector.MatchLabels, np.Spec.PodSelector.MatchExpressions).Matches(elasticPodAs(d, role)) {
				by = append(by, o.name)
			}
		}
		want := slices.Sorted(slices.Values([]string{elasticName, releaseName + "-pdserve-" + role}))
		if diff := cmp.Diff(want, slices.Sorted(slices.Values(by))); diff != "" {
			t.Errorf("elastic pod as %s: NetworkPolicies (-want +got):\n%s", role, diff)
		}
	}
}
