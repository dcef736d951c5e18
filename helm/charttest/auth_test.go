package charttest

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/pdserve/pdserve/pkg/coordinator"
	"github.com/pdserve/pdserve/pkg/plannerhost"
)

// TestAuthSecrets: auth.apiKeysSecret and auth.metricsTokenSecret mount
// their Secret's key (api-keys, metrics-token) into the coordinator as a
// directory (no subPath, so that an updated Secret reaches the pod) and
// pass the file as --api-keys and --metrics-token-file, flags the
// coordinator defines; without them, neither flag nor volume.
func TestAuthSecrets(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	type mount struct{ flag, volume, secret, key string }
	tests := []struct {
		name   string
		values string
		want   []mount
	}{
		{name: "off", values: ""},
		{name: "api keys", values: "auth: {apiKeysSecret: team-keys}\n",
			want: []mount{{"api-keys", "api-keys", "team-keys", "api-keys"}}},
		{name: "both", values: "auth: {apiKeysSecret: team-keys, metricsTokenSecret: scrape-token}\n",
			want: []mount{{"api-keys", "api-keys", "team-keys", "api-keys"}, {"metrics-token-file", "metrics-token", "scrape-token", "metrics-token"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vs := valuesSet{name: tc.name}
			if tc.values != "" {
				vs.file = file(tc.name+"-values.yaml", tc.values)
			}
			r := render(t, vs)
			spec := &r.deployment(t, coordinatorName).Spec.Template.Spec
			c := container(t, spec, "coordinator")
			args, err := expandArgs(c)
			if err != nil {
				t.Fatal(err)
			}
			o := coordinator.DefaultOptions()
			po := plannerhost.DefaultOptions()
			fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o.AddFlags(fs)
			po.AddFlags(fs)
			if err := fs.Parse(args); err != nil {
				t.Fatalf("coordinator rejects its args: %v", err)
			}
			given := map[string]string{}
			fs.Visit(func(f *flag.Flag) { given[f.Name] = f.Value.String() })
			for _, name := range []string{"api-keys", "metrics-token-file"} {
				var w *mount
				for i := range tc.want {
					if tc.want[i].flag == name {
						w = &tc.want[i]
					}
				}
				path, ok := given[name]
				if w == nil {
					if ok {
						t.Errorf("--%s=%s without its Secret", name, path)
					}
					if findVolume(spec, strings.TrimSuffix(name, "-file")) != nil {
						t.Errorf("volume %s without its Secret", name)
					}
					continue
				}
				v := findVolume(spec, w.volume)
				m := findMount(c, w.volume)
				switch {
				case v == nil || v.Secret == nil || m == nil:
					t.Fatalf("--%s: no Secret volume %s mounted", name, w.volume)
				case v.Secret.SecretName != w.secret || len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != w.key:
					t.Errorf("volume %s: %+v, want Secret %s key %s", w.volume, v.Secret, w.secret, w.key)
				case m.SubPath != "" || !m.ReadOnly:
					t.Errorf("mount %s: %+v, want read-only without subPath", w.volume, m)
				case path != filepath.Join(m.MountPath, v.Secret.Items[0].Path):
					t.Errorf("--%s=%s, but the Secret's key is mounted at %s", name, path, filepath.Join(m.MountPath, v.Secret.Items[0].Path))
				}
			}
			if o.Auth.APIKeysFile != given["api-keys"] || o.Auth.MetricsTokenFile != given["metrics-token-file"] {
				t.Errorf("options %+v from args %v", o.Auth, given)
			}
		})
	}
}

// TestAuthScrapeAndHelmTest: with auth.metricsTokenSecret the
// ServiceMonitor and PodMonitor send that Secret's token to the
// coordinator's /metrics (and to no worker's); with auth.apiKeysSecret the
// helm test sends test.apiKeySecret's key, or, without one, checks that a
// request without a key is refused.
func TestAuthScrapeAndHelmTest(t *testing.T) {
	dir := t.TempDir()
	values := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(values, []byte(`auth: {apiKeysSecret: team-keys, metricsTokenSecret: scrape-token}
test: {apiKeySecret: test-key}
metrics: {serviceMonitor: {enabled: true}, podMonitor: {enabled: true}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := render(t, valuesSet{name: "auth", file: values})
	var eps []monitorEndpoint
	for _, o := range r.all("ServiceMonitor") {
		eps = append(eps, o.obj.(*serviceMonitor).Spec.Endpoints...)
	}
	for _, o := range r.all("PodMonitor") {
		eps = append(eps, o.obj.(*podMonitor).Spec.PodMetricsEndpoints...)
	}
	if len(eps) != 4 {
		t.Fatalf("%d monitor endpoints, want 4 (http and metrics of a ServiceMonitor and a PodMonitor)", len(eps))
	}
	for _, ep := range eps {
		a := ep.Authorization
		switch {
		case ep.Port == "http" && (a == nil || a.Type != "Bearer" || a.Credentials.Name != "scrape-token" || a.Credentials.Key != "metrics-token"):
			t.Errorf("coordinator endpoint authorization %+v, want Bearer from scrape-token/metrics-token", a)
		case ep.Port == "metrics" && a != nil:
			t.Errorf("worker endpoint sends the coordinator's metrics token: %+v", a)
		}
	}
	var pod *corev1.Pod
	for _, o := range r.all("Pod") {
		pod = o.obj.(*corev1.Pod)
	}
	if pod == nil {
		t.Fatal("no helm test pod")
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if !slices.Contains(pod.Spec.Containers[0].Args, "--auth") {
		t.Errorf("test pod args %q lack --auth (API keys on)", pod.Spec.Containers[0].Args)
	}
	// pdserve-loadtest check sends $OPENAI_API_KEY as its bearer token.
	if ref := env["OPENAI_API_KEY"].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "test-key" || ref.SecretKeyRef.Key != "api-key" {
		t.Errorf("test pod OPENAI_API_KEY %+v, want from Secret test-key, key api-key", env["OPENAI_API_KEY"])
	}
}
