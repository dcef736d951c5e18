package charttest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// engineFlagNames are the flags of pkg/enginecfg, which select and
// configure a container's engine.
var engineFlagNames = []string{"engine", "preset", "seed", "engine-threads", "profile", "time-scale", "payload-scale",
	"model", "llama-lib", "gpu-layers", "ctx-size", "kv-type", "max-seqs"}

// engineFlags returns the engine flags among args, in order.
func engineFlags(args []string) []string {
	var out []string
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if slices.Contains(engineFlagNames, name) {
			out = append(out, a)
		}
	}
	return out
}

// flagValue returns the value of --name in args, and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func findEnv(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func findMount(c corev1.Container, name string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func findVolume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// checkLlamacpp: with engine.type=llamacpp every pdserve pod (coordinator,
// prefill and decode) runs the llama.cpp image of its role with its binary
// as the command, finds the libraries through PDSERVE_LLAMA_LIB, mounts
// the model volume read-only and gets --model at model.file inside it;
// with model.source=download an init container fills that volume, and a
// token reaches it only from the Secret. Without llamacpp none of this is
// rendered.
func checkLlamacpp(t *testing.T, r release) {
	llama := r.value("engine.type") == "llamacpp"
	for _, p := range pools(r) {
		spec := &r.deployment(t, p.deployment).Spec.Template.Spec
		c := container(t, spec, p.container)
		args, err := expandArgs(c)
		if err != nil {
			t.Fatal(err)
		}
		model, hasModel := flagValue(args, "model")
		if !llama {
			if c.Command != nil || findEnv(c, "PDSERVE_LLAMA_LIB") != nil || findVolume(spec, modelVolume) != nil ||
				len(spec.InitContainers) > 0 || hasModel {
				t.Errorf("%s: llama.cpp settings without engine.type=llamacpp: command %q, env %v, volumes %v, init containers %d, --model %q",
					p.deployment, c.Command, c.Env, spec.Volumes, len(spec.InitContainers), model)
			}
			continue
		}
		imageKey := "image.llamacpp"
		if p.container == "coordinator" {
			imageKey = "image.llamacppCPU" // it loads only the vocabulary
		}
		if want := r.imageRef(imageKey); c.Image != want {
			t.Errorf("%s: image %s, want %s (%s)", p.deployment, c.Image, want, imageKey)
		}
		if want := []string{"/usr/local/bin/" + p.container}; !slices.Equal(c.Command, want) {
			t.Errorf("%s: command %q, want %q: the llama.cpp images hold all three binaries", p.deployment, c.Command, want)
		}
		if e := findEnv(c, "PDSERVE_LLAMA_LIB"); e == nil || e.Value != r.value(imageKey+".libDir") {
			t.Errorf("%s: PDSERVE_LLAMA_LIB %+v, want %v (%s.libDir)", p.deployment, e, r.value(imageKey+".libDir"), imageKey)
		}
		if engine, _ := flagValue(args, "engine"); engine != "llamacpp" {
			t.Errorf("%s: --engine=%s, want llamacpp", p.deployment, engine)
		}
		m := findMount(c, modelVolume)
		v := findVolume(spec, modelVolume)
		if m == nil || v == nil {
			t.Errorf("%s: no model volume (mount %v, volume %v)", p.deployment, m, v)
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s: model volume mounted read-write", p.deployment)
		}
		if want := filepath.Join(m.MountPath, fmt.Sprint(r.value("model.file"))); model != want {
			t.Errorf("%s: --model=%q, want %q (model.file in the model volume at %s)", p.deployment, model, want, m.MountPath)
		}
		checkModelInit(t, r, p.deployment, spec, *m)
	}
}

// checkModelInit: a pod whose model is downloaded has one init container,
// model-download, that writes the volume its main container reads, at the
// same place; the token comes only from model.download.tokenSecret; other
// sources have no init container.
func checkModelInit(t *testing.T, r release, where string, spec *corev1.PodSpec, m corev1.VolumeMount) {
	t.Helper()
	if r.value("model.source") != "download" {
		if len(spec.InitContainers) > 0 {
			t.Errorf("%s: init containers without model.source=download", where)
		}
		return
	}
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "model-download" {
		t.Errorf("%s: init containers %d, want one model-download", where, len(spec.InitContainers))
		return
	}
	ic := spec.InitContainers[0]
	im := findMount(ic, modelVolume)
	if im == nil || im.ReadOnly || im.MountPath != m.MountPath || im.SubPath != m.SubPath {
		t.Errorf("%s: model-download mounts the model volume as %+v, want read-write where the worker reads it (%+v)", where, im, m)
	}
	if e := findEnv(ic, "MODEL_DEST"); e == nil || e.Value != filepath.Join(m.MountPath, fmt.Sprint(r.value("model.file"))) {
		t.Errorf("%s: model-download MODEL_DEST %+v, want model.file in the volume", where, e)
	}
	secret, _ := r.value("model.download.tokenSecret.name").(string)
	tok := findEnv(ic, "MODEL_TOKEN")
	switch {
	case secret == "" && tok != nil:
		t.Errorf("%s: MODEL_TOKEN %+v without model.download.tokenSecret", where, tok)
	case secret != "" && (tok == nil || tok.Value != "" || tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil ||
		tok.ValueFrom.SecretKeyRef.Name != secret || tok.ValueFrom.SecretKeyRef.Key != r.value("model.download.tokenSecret.key")):
		t.Errorf("%s: MODEL_TOKEN %+v, want it from Secret %s key %v", where, tok, secret, r.value("model.download.tokenSecret.key"))
	}
	// The token reaches curl on its standard input (--config -), never as
	// an argument, which any process on the node could read.
	script := strings.Join(append(slices.Clone(ic.Command), ic.Args...), " ")
	if !strings.Contains(script, "--config -") || strings.Count(script, "$MODEL_TOKEN") != 1 ||
		strings.Contains(script, "--header") || strings.Contains(script, " -H ") || strings.Contains(script, "--user") {
		t.Errorf("%s: model-download may put the token on a command line:\n%s", where, script)
	}
}

// wantLlamacpp lists, per values set, what the llamacpp pods must get:
// stated here rather than read back from the values, so that a template
// that ignores a setting fails.
var wantLlamacpp = map[string]struct {
	workerImage, coordinatorImage string
	workerFlags                   []string // engine flags of every worker
	coordinatorFlags              []string
	gpus                          int64 // nvidia.com/gpu per worker
	volume                        corev1.VolumeSource
	mount                         corev1.VolumeMount
	download                      string // URL, "" without download
	tokenSecret                   string
}{
	"llamacpp-cpu": {
		workerImage:      "ghcr.io/pdserve/worker-cpu:0.1.0",
		coordinatorImage: "ghcr.io/pdserve/worker-cpu:0.1.0",
		workerFlags: []string{"--engine=llamacpp", "--model=/models/qwen2.5-0.5b-q8_0.gguf",
			"--gpu-layers=0", "--ctx-size=4096", "--kv-type=f16", "--max-seqs=8", "--engine-threads=2"},
		coordinatorFlags: []string{"--engine=llamacpp", "--model=/models/qwen2.5-0.5b-q8_0.gguf"},
		volume:           corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/pdserve/models", Type: ptrTo(corev1.HostPathDirectory)}},
		mount:            corev1.VolumeMount{Name: "model", MountPath: "/models", ReadOnly: true},
	},
	"llamacpp-gpu": {
		workerImage:      "ghcr.io/pdserve/worker-cuda:0.1.0",
		coordinatorImage: "ghcr.io/pdserve/worker-cpu:0.1.0",
		workerFlags: []string{"--engine=llamacpp", "--model=/models/llama-3.1-8b-instruct/model-q8_0.gguf",
			"--gpu-layers=-1", "--ctx-size=65536", "--kv-type=f16", "--max-seqs=64"},
		coordinatorFlags: []string{"--engine=llamacpp", "--model=/models/llama-3.1-8b-instruct/model-q8_0.gguf"},
		gpus:             1,
		volume:           corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "pdserve-models"}},
		mount:            corev1.VolumeMount{Name: "model", MountPath: "/models", ReadOnly: true},
		download:         "https://huggingface.co/your-org/llama-3.1-8b-instruct-gguf/resolve/main/model-q8_0.gguf",
		tokenSecret:      "hf-token",
	},
	"llamacpp-colocated": {
		workerImage:      "ghcr.io/pdserve/worker-cuda:0.1.0",
		coordinatorImage: "ghcr.io/pdserve/worker-cpu:0.1.0",
		workerFlags: []string{"--engine=llamacpp", "--model=/models/model-q8_0.gguf",
			"--gpu-layers=-1", "--ctx-size=65536", "--kv-type=q8_0"},
		coordinatorFlags: []string{"--engine=llamacpp", "--model=/models/model-q8_0.gguf"},
		gpus:             1,
		volume:           corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "pdserve-models", ReadOnly: true}},
		mount:            corev1.VolumeMount{Name: "model", MountPath: "/models", ReadOnly: true, SubPath: "llama-3.1-8b-instruct"},
	},
	// Each pod downloads its own copy, into an emptyDir, without a token.
	"download-emptydir": {
		workerImage:      "registry.example.com/pdserve/worker-cuda:dev",
		coordinatorImage: "ghcr.io/pdserve/worker-cpu:0.1.0",
		workerFlags:      []string{"--engine=llamacpp", "--model=/weights/tiny.gguf"},
		coordinatorFlags: []string{"--engine=llamacpp", "--model=/weights/tiny.gguf"},
		gpus:             1,
		volume:           corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptrTo(resource.MustParse("2Gi"))}},
		mount:            corev1.VolumeMount{Name: "model", MountPath: "/weights", ReadOnly: true},
		download:         "https://models.example.com/tiny.gguf",
	},
}

// extraLlamacppSets are values sets of TestLlamacppRender beyond those of
// helm/pdserve/ci.
var extraLlamacppSets = map[string]string{
	"download-emptydir": `
engine: {type: llamacpp}
model:
  source: download
  file: tiny.gguf
  mountPath: /weights
  download:
    url: https://models.example.com/tiny.gguf
    sizeLimit: 2Gi
image:
  llamacpp: {registry: registry.example.com/pdserve, repository: worker-cuda, tag: dev}
`,
}

func ptrTo[T any](v T) *T { return &v }

// TestLlamacppRender checks the rendered llamacpp pods against
// wantLlamacpp: images, engine flags, GPUs, the model volume and its
// mounts, and the download init container.
func TestLlamacppRender(t *testing.T) {
	sets := map[string]valuesSet{}
	for _, vs := range valuesSets(t) {
		sets[vs.name] = vs
	}
	for name, values := range extraLlamacppSets {
		f := filepath.Join(t.TempDir(), name+"-values.yaml")
		if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
			t.Fatal(err)
		}
		sets[name] = valuesSet{name: name, file: f}
	}
	for name, want := range wantLlamacpp {
		t.Run(name, func(t *testing.T) {
			vs, ok := sets[name]
			if !ok {
				t.Fatalf("no values set %s", name)
			}
			r := render(t, vs)
			checkLlamacpp(t, r)
			for _, p := range pools(r) {
				d := r.deployment(t, p.deployment)
				spec := &d.Spec.Template.Spec
				c := container(t, spec, p.container)
				wantImage, wantFlags := want.workerImage, want.workerFlags
				if p.container == "coordinator" {
					wantImage, wantFlags = want.coordinatorImage, want.coordinatorFlags
				}
				if c.Image != wantImage {
					t.Errorf("%s: image %s, want %s", p.deployment, c.Image, wantImage)
				}
				if diff := cmp.Diff(wantFlags, engineFlags(c.Args)); diff != "" {
					t.Errorf("%s: engine flags (-want +got):\n%s", p.deployment, diff)
				}
				if p.container != "coordinator" {
					gpus := c.Resources.Limits[r.gpuResource()]
					if gpus.Value() != want.gpus {
						t.Errorf("%s: %d GPUs, want %d", p.deployment, gpus.Value(), want.gpus)
					}
				}
				v := findVolume(spec, modelVolume)
				if v == nil {
					t.Fatalf("%s: no model volume", p.deployment)
				}
				if diff := cmp.Diff(want.volume, v.VolumeSource, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s: model volume (-want +got):\n%s", p.deployment, diff)
				}
				if m := findMount(c, modelVolume); m == nil {
					t.Errorf("%s: no model mount", p.deployment)
				} else if diff := cmp.Diff(want.mount, *m); diff != "" {
					t.Errorf("%s: model mount (-want +got):\n%s", p.deployment, diff)
				}
				checkDownload(t, p.deployment, spec, want.download, want.tokenSecret)
			}
			for _, want := range []string{"engine:          llamacpp", want.workerImage, strings.TrimPrefix(want.workerFlags[1], "--model=")} {
				if !strings.Contains(r.notes, want) {
					t.Errorf("NOTES.txt lacks %q:\n%s", want, r.notes)
				}
			}
		})
	}
}

// checkDownload: the pod's model-download init container fetches url
// with the token of Secret tokenSecret (none: no token); url "": no init
// container.
func checkDownload(t *testing.T, where string, spec *corev1.PodSpec, url, tokenSecret string) {
	t.Helper()
	if url == "" {
		if len(spec.InitContainers) != 0 {
			t.Errorf("%s: %d init containers, want none", where, len(spec.InitContainers))
		}
		return
	}
	if len(spec.InitContainers) != 1 {
		t.Fatalf("%s: %d init containers, want model-download", where, len(spec.InitContainers))
	}
	ic := spec.InitContainers[0]
	if e := findEnv(ic, "MODEL_URL"); e == nil || e.Value != url {
		t.Errorf("%s: MODEL_URL %+v, want %s", where, e, url)
	}
	var gotSecret string
	if e := findEnv(ic, "MODEL_TOKEN"); e != nil && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
		gotSecret = e.ValueFrom.SecretKeyRef.Name
	}
	if gotSecret != tokenSecret {
		t.Errorf("%s: token from Secret %q, want %q", where, gotSecret, tokenSecret)
	}
}

// TestModelDownloadScript runs the model-download init container's script
// with the local sh and curl against an HTTP server that wants a bearer
// token: it must send the token, write the file complete or not at all,
// check the SHA-256, and skip a file that is already there.
func TestModelDownloadScript(t *testing.T) {
	for _, tool := range []string{"sh", "curl", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("the script needs %s, which this machine lacks (CI must have it): %v", tool, err)
			}
			t.Skipf("the script needs %s, which this machine lacks: %v", tool, err)
		}
	}
	r := render(t, valuesSet{name: "llamacpp-gpu", file: filepath.Join(chartDir, "ci", "llamacpp-gpu-values.yaml")})
	spec := &r.deployment(t, decodeName).Spec.Template.Spec
	if len(spec.InitContainers) != 1 {
		t.Fatalf("%d init containers, want model-download", len(spec.InitContainers))
	}
	ic := spec.InitContainers[0]
	if want := []string{"/bin/sh", "-c"}; !slices.Equal(ic.Command, want) || len(ic.Args) != 1 {
		t.Fatalf("model-download runs %q %d args, want %q and a script", ic.Command, len(ic.Args), want)
	}
	script := ic.Args[0]

	const token = "hf_sampletoken0123"
	body := []byte("GGUF pretend model bytes\n")
	sum := sha256.Sum256(body)
	var mu sync.Mutex
	var requests []string // Authorization headers, in order
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		requests = append(requests, req.Header.Get("Authorization"))
		mu.Unlock()
		switch {
		case req.URL.Path == "/public.gguf":
		case req.URL.Path != "/gated.gguf":
			http.NotFound(w, req)
			return
		case req.Header.Get("Authorization") != "Bearer "+token:
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()

	run := func(dest string, env map[string]string) error {
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOSTNAME=pd-pdserve-decode-0", "MODEL_DEST=" + dest}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	tests := []struct {
		name    string
		env     map[string]string
		present bool   // the file is there before
		wantErr bool   // the script fails
		wantReq string // the Authorization header sent, "-" for no request
	}{
		{name: "token", env: map[string]string{"MODEL_URL": srv.URL + "/gated.gguf", "MODEL_TOKEN": token}, wantReq: "Bearer " + token},
		{name: "no token, public", env: map[string]string{"MODEL_URL": srv.URL + "/public.gguf"}, wantReq: ""},
		{name: "sha256 checked", env: map[string]string{"MODEL_URL": srv.URL + "/public.gguf", "MODEL_SHA256": hex.EncodeToString(sum[:])}, wantReq: ""},
		{name: "sha256 mismatch", env: map[string]string{"MODEL_URL": srv.URL + "/public.gguf", "MODEL_SHA256": strings.Repeat("0", 64)}, wantErr: true, wantReq: ""},
		{name: "wrong token", env: map[string]string{"MODEL_URL": srv.URL + "/gated.gguf", "MODEL_TOKEN": "hf_wrong"}, wantErr: true, wantReq: "Bearer hf_wrong"},
		{name: "not found", env: map[string]string{"MODEL_URL": srv.URL + "/missing.gguf"}, wantErr: true, wantReq: ""},
		{name: "already present", env: map[string]string{"MODEL_URL": srv.URL + "/gated.gguf"}, present: true, wantReq: "-"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			dest := filepath.Join(dir, "llama", "model.gguf")
			if tc.present {
				if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(dest, body, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			mu.Lock()
			requests = nil
			mu.Unlock()
			err := run(dest, tc.env)
			if (err != nil) != tc.wantErr {
				t.Fatalf("script error %v, want error %v", err, tc.wantErr)
			}
			mu.Lock()
			got := slices.Clone(requests)
			mu.Unlock()
			want := []string{tc.wantReq}
			if tc.wantReq == "-" {
				want = nil
			}
			if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Authorization headers of the requests (-want +got):\n%s", diff)
			}
			b, rerr := os.ReadFile(dest)
			switch {
			case tc.wantErr && !errors.Is(rerr, os.ErrNotExist):
				t.Errorf("after a failed download %s exists (%v): a reader could load a bad model", dest, rerr)
			case !tc.wantErr && string(b) != string(body):
				t.Errorf("%s = %q (%v), want the served file", dest, b, rerr)
			}
			left, _ := filepath.Glob(filepath.Join(dir, "llama", "*.part-*"))
			if len(left) > 0 {
				t.Errorf("partial files left: %v", left)
			}
		})
	}
}
