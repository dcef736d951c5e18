package charttest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// imageRef is the reference the chart must give the pdserve image at the
// values path key (e.g. "coordinator.image"): its own registry or else
// image.registry, then repository:tag (tag default: appVersion).
func (r release) imageRef(key string) string {
	reg, _ := r.value(key + ".registry").(string)
	if reg == "" {
		reg, _ = r.value("image.registry").(string)
	}
	repo := fmt.Sprint(r.value(key + ".repository"))
	if reg != "" {
		repo = strings.TrimSuffix(reg, "/") + "/" + repo
	}
	tag, _ := r.value(key + ".tag").(string)
	if tag == "" {
		tag = r.appVersion
	}
	return repo + ":" + tag
}

// images returns the image of every container (init containers too) of
// every pod template, by "Kind/name container".
func (r release) images() map[string]string {
	out := map[string]string{}
	for name, spec := range r.podSpecs() {
		for _, c := range spec.InitContainers {
			out[name+" "+c.Name] = c.Image
		}
		for _, c := range spec.Containers {
			out[name+" "+c.Name] = c.Image
		}
	}
	return out
}

// TestImageRegistry checks that image.registry moves every pdserve image
// (the helm test's loadtest image too) and no other, that an image's own
// registry wins over it, and that with neither the repository is the
// whole name.
func TestImageRegistry(t *testing.T) {
	tests := []struct {
		name   string
		values string
		want   map[string]string
	}{
		{
			name: "defaults", values: ``,
			want: map[string]string{
				"Deployment/pd-pdserve-coordinator coordinator": "ghcr.io/pdserve/coordinator:0.1.0",
				"Deployment/pd-pdserve-prefill prefill-worker":  "ghcr.io/pdserve/prefill-worker:0.1.0",
				"Deployment/pd-pdserve-decode decode-worker":    "ghcr.io/pdserve/decode-worker:0.1.0",
				"Deployment/pd-pdserve-nats nats":               "nats:2.15.3-alpine",
				"Pod/pd-pdserve-test-completion completion":     "ghcr.io/pdserve/loadtest:0.1.0",
			},
		},
		{
			name: "your registry", values: `image: {registry: registry.example.com/team}`,
			want: map[string]string{
				"Deployment/pd-pdserve-coordinator coordinator": "registry.example.com/team/coordinator:0.1.0",
				"Deployment/pd-pdserve-prefill prefill-worker":  "registry.example.com/team/prefill-worker:0.1.0",
				"Deployment/pd-pdserve-decode decode-worker":    "registry.example.com/team/decode-worker:0.1.0",
				"Deployment/pd-pdserve-nats nats":               "nats:2.15.3-alpine",
				"Pod/pd-pdserve-test-completion completion":     "registry.example.com/team/loadtest:0.1.0",
			},
		},
		{
			name: "per-image registry and tag, mirrored NATS",
			values: `
image: {registry: registry.example.com/team}
coordinator: {image: {registry: mirror.example.com/pd, tag: dev}}
test: {image: {repository: pdserve-loadtest}}
nats: {image: {registry: mirror.example.com/library}}
`,
			want: map[string]string{
				"Deployment/pd-pdserve-coordinator coordinator": "mirror.example.com/pd/coordinator:dev",
				"Deployment/pd-pdserve-prefill prefill-worker":  "registry.example.com/team/prefill-worker:0.1.0",
				"Deployment/pd-pdserve-decode decode-worker":    "registry.example.com/team/decode-worker:0.1.0",
				"Deployment/pd-pdserve-nats nats":               "mirror.example.com/library/nats:2.15.3-alpine",
				"Pod/pd-pdserve-test-completion completion":     "registry.example.com/team/pdserve-loadtest:0.1.0",
			},
		},
		{
			name: "no registry: the repository is the name",
			values: `
image: {registry: ""}
coordinator: {image: {repository: localhost/pdserve/coordinator}}
`,
			want: map[string]string{
				"Deployment/pd-pdserve-coordinator coordinator": "localhost/pdserve/coordinator:0.1.0",
				"Deployment/pd-pdserve-prefill prefill-worker":  "prefill-worker:0.1.0",
				"Deployment/pd-pdserve-decode decode-worker":    "decode-worker:0.1.0",
				"Deployment/pd-pdserve-nats nats":               "nats:2.15.3-alpine",
				"Pod/pd-pdserve-test-completion completion":     "loadtest:0.1.0",
			},
		},
		{
			name: "llamacpp: both llama.cpp images under the registry, the download image not",
			values: `
image: {registry: registry.example.com/team}
engine: {type: llamacpp}
model: {source: download, file: m.gguf, download: {url: "https://models.example.com/m.gguf"}}
`,
			want: map[string]string{
				"Deployment/pd-pdserve-coordinator coordinator":    "registry.example.com/team/worker-cpu:0.1.0",
				"Deployment/pd-pdserve-coordinator model-download": "curlimages/curl:8.17.0",
				"Deployment/pd-pdserve-prefill prefill-worker":     "registry.example.com/team/worker-cuda:0.1.0",
				"Deployment/pd-pdserve-prefill model-download":     "curlimages/curl:8.17.0",
				"Deployment/pd-pdserve-decode decode-worker":       "registry.example.com/team/worker-cuda:0.1.0",
				"Deployment/pd-pdserve-decode model-download":      "curlimages/curl:8.17.0",
				"Deployment/pd-pdserve-nats nats":                  "nats:2.15.3-alpine",
				"Pod/pd-pdserve-test-completion completion":        "registry.example.com/team/loadtest:0.1.0",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs := valuesSet{name: tt.name}
			if tt.values != "" {
				vs.file = filepath.Join(t.TempDir(), "values.yaml")
				if err := os.WriteFile(vs.file, []byte(tt.values), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tt.want, render(t, vs).images()); diff != "" {
				t.Errorf("images (-want +got):\n%s", diff)
			}
		})
	}
}
