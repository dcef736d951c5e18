package charttest

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// Where the chart is, relative to this package, and what it is rendered as.
const (
	chartDir    = "../pdserve"
	badDir      = "../testdata/bad"
	releaseName = "pd"
	namespace   = "pdserve"
	kubeVersion = "v1.33.0"
)

// valuesSet is one entry of the values matrix: the chart's defaults, or
// defaults plus one file of helm/pdserve/ci.
type valuesSet struct {
	name string // "defaults" or the file name without "-values.yaml"
	file string // "" for defaults
}

// valuesSets returns the matrix. The sets the chart must support are
// required to exist, so that deleting one fails here.
func valuesSets(t *testing.T) []valuesSet {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sets := []valuesSet{{name: "defaults"}}
	have := map[string]bool{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), "-values.yaml")
		have[name] = true
		sets = append(sets, valuesSet{name: name, file: f})
	}
	for _, want := range []string{"external-nats", "planner-actuator", "tls", "cpu-trial", "gpu-two-pools", "colocated",
		"llamacpp-cpu", "llamacpp-gpu", "llamacpp-colocated", "production"} {
		if !have[want] {
			t.Errorf("values matrix lacks ci/%s-values.yaml", want)
		}
	}
	return sets
}

// object is one rendered Kubernetes object, decoded strictly into its API
// type (a pointer such as *appsv1.Deployment).
type object struct {
	source string // template path, e.g. pdserve/templates/coordinator.yaml
	kind   string
	name   string
	obj    any
}

// release is the chart rendered for one values set.
type release struct {
	values     chartutil.Values // the coalesced .Values the templates saw
	appVersion string           // the chart's appVersion, the default image tag
	objects    []object
	notes      string
}

// loadChart loads the chart directory.
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// renderValues coalesces file's values (none for "") with the chart's
// defaults, validating them against values.schema.json as helm install
// does, and returns the top-level render values.
func renderValues(ch *chart.Chart, file string) (chartutil.Values, error) {
	vals := map[string]any{}
	if file != "" {
		v, err := chartutil.ReadValuesFile(file)
		if err != nil {
			return nil, err
		}
		vals = v
	}
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	caps := &chartutil.Capabilities{
		KubeVersion: *kv,
		APIVersions: chartutil.DefaultVersionSet,
		HelmVersion: chartutil.DefaultCapabilities.HelmVersion,
	}
	opts := chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true}
	return chartutil.ToRenderValues(ch, vals, opts, caps)
}

// renderError renders the chart of ch for the YAML values and returns
// the error of the values or the rendering, nil when both pass.
func renderError(t *testing.T, ch *chart.Chart, values string) error {
	t.Helper()
	top, err := renderValues(ch, writeValues(t, values))
	if err == nil {
		_, err = engine.Render(ch, top)
	}
	return err
}

// render renders the chart for vs and decodes every object strictly.
func render(t *testing.T, vs valuesSet) release {
	t.Helper()
	ch := loadChart(t)
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kubeVersion) {
		t.Fatalf("chart kubeVersion %q excludes %s", ch.Metadata.KubeVersion, kubeVersion)
	}
	top, err := renderValues(ch, vs.file)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	vals, err := top.Table("Values")
	if err != nil {
		t.Fatal(err)
	}
	rel := release{values: vals, appVersion: ch.Metadata.AppVersion}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		content := files[name]
		if strings.HasSuffix(name, "NOTES.txt") {
			rel.notes = content
			continue
		}
		docs := releaseutil.SplitManifests(content)
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			doc := docs[k]
			if isBlank(doc) {
				continue
			}
			o, err := decodeStrict(doc)
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			o.source = name
			rel.objects = append(rel.objects, o)
		}
	}
	if len(rel.objects) == 0 {
		t.Fatal("chart rendered no objects")
	}
	return rel
}

// isBlank reports whether a YAML document holds only comments and space.
func isBlank(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") && line != "---" {
			return false
		}
	}
	return true
}

// decodeStrict decodes one YAML document into the Go type of its
// apiVersion and kind, failing on unknown or duplicate fields and on kinds
// the chart is not expected to render.
func decodeStrict(doc string) (object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		return object{}, fmt.Errorf("type meta: %w", err)
	}
	var obj any
	switch tm.APIVersion + "/" + tm.Kind {
	case "apps/v1/Deployment":
		obj = &appsv1.Deployment{}
	case "v1/Service":
		obj = &corev1.Service{}
	case "v1/ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1/Secret":
		obj = &corev1.Secret{}
	case "v1/ServiceAccount":
		obj = &corev1.ServiceAccount{}
	case "v1/Pod":
		obj = &corev1.Pod{}
	case "policy/v1/PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "rbac.authorization.k8s.io/v1/Role":
		obj = &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		obj = &rbacv1.RoleBinding{}
	case "networking.k8s.io/v1/Ingress":
		obj = &networkingv1.Ingress{}
	case "networking.k8s.io/v1/NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "cert-manager.io/v1/Certificate":
		obj = &certificate{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		obj = &serviceMonitor{}
	case "monitoring.coreos.com/v1/PodMonitor":
		obj = &podMonitor{}
	default:
		return object{}, fmt.Errorf("unexpected kind %s %s", tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		return object{}, fmt.Errorf("strict decode %s: %w", tm.Kind, err)
	}
	meta := obj.(metav1.ObjectMetaAccessor).GetObjectMeta()
	if meta.GetName() == "" {
		return object{}, fmt.Errorf("%s without a name", tm.Kind)
	}
	if meta.GetNamespace() != namespace {
		return object{}, fmt.Errorf("%s %s: namespace %q, want %q", tm.Kind, meta.GetName(), meta.GetNamespace(), namespace)
	}
	return object{kind: tm.Kind, name: meta.GetName(), obj: obj}, nil
}

// The Prometheus Operator CRDs are not in k8s.io/api: these mirror the
// fields of monitoring.coreos.com/v1 the chart uses, so that strict
// decoding still catches a misspelt or misplaced field.
type (
	serviceMonitor struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			Selector          metav1.LabelSelector `json:"selector"`
			NamespaceSelector namespaceSelector    `json:"namespaceSelector"`
			Endpoints         []monitorEndpoint    `json:"endpoints"`
		} `json:"spec"`
	}
	podMonitor struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              struct {
			Selector            metav1.LabelSelector `json:"selector"`
			NamespaceSelector   namespaceSelector    `json:"namespaceSelector"`
			PodMetricsEndpoints []monitorEndpoint    `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	namespaceSelector struct {
		Any        bool     `json:"any,omitempty"`
		MatchNames []string `json:"matchNames,omitempty"`
	}
	monitorEndpoint struct {
		Port          string `json:"port"`
		Path          string `json:"path,omitempty"`
		Interval      string `json:"interval,omitempty"`
		Authorization *struct {
			Type        string                   `json:"type"`
			Credentials corev1.SecretKeySelector `json:"credentials"`
		} `json:"authorization,omitempty"`
	}
)

// find returns the object of kind and name, or nil.
func (r release) find(kind, name string) any {
	for _, o := range r.objects {
		if o.kind == kind && o.name == name {
			return o.obj
		}
	}
	return nil
}

// all returns the objects of kind.
func (r release) all(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// deployment returns the Deployment name or fails.
func (r release) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	d, ok := r.find("Deployment", name).(*appsv1.Deployment)
	if !ok {
		t.Fatalf("no Deployment %s", name)
	}
	return d
}

// podSpecs returns every pod template of the release (Deployments and
// bare Pods) by object name.
func (r release) podSpecs() map[string]*corev1.PodSpec {
	out := map[string]*corev1.PodSpec{}
	for _, o := range r.objects {
		switch v := o.obj.(type) {
		case *appsv1.Deployment:
			out[o.kind+"/"+o.name] = &v.Spec.Template.Spec
		case *corev1.Pod:
			out[o.kind+"/"+o.name] = &v.Spec
		}
	}
	return out
}

// value reads a value at a dotted path of the coalesced values; nil when
// absent.
func (r release) value(path string) any {
	v, err := r.values.PathValue(path)
	if err != nil {
		return nil
	}
	return v
}

// table reads a map at a dotted path; nil when absent.
func (r release) table(path string) map[string]any {
	v, err := r.values.Table(path)
	if err != nil {
		return nil
	}
	return v.AsMap()
}

// intValue reads a whole number at path (values decode as float64 or int64).
func (r release) intValue(t *testing.T, path string) int64 {
	t.Helper()
	switch v := r.value(path).(type) {
	case float64:
		return int64(v)
	case int64:
		return v
	case int:
		return int64(v)
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return n
	default:
		t.Fatalf("%s = %#v, want a number", path, v)
		return 0
	}
}

// convert re-decodes a values subtree into a typed Kubernetes value.
func convert(t *testing.T, in, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("convert %s: %v", b, err)
	}
}

// quoteAll is a %q join for messages.
func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, " ")
}

// mustSelector converts a label selector or fails.
func mustSelector(t *testing.T, match map[string]string, exprs []metav1.LabelSelectorRequirement) labels.Selector {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: match, MatchExpressions: exprs})
	if err != nil {
		t.Fatalf("selector: %v", err)
	}
	return sel
}

// chartutilKubeVersion is kubeVersion parsed for Helm.
func chartutilKubeVersion() (*chartutil.KubeVersion, error) {
	return chartutil.ParseKubeVersion(kubeVersion)
}
