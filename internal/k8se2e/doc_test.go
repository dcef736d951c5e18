package k8se2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pdserve/pdserve/internal/repotest"
)

// docCommands are the commands of docs/kubernetes.md's section "Try it on
// the repository's own cluster", by the name of their block (the marker
// <!-- k8s-e2e: NAME --> before it): the e2e runs exactly these, and
// TestDocCommands checks that the page shows exactly these. They read
// MODELS (a directory on the node for the model), REGISTRY (the registry
// of the images) and, for the node pools, PREFILL_NODES and DECODE_NODES.
var docCommands = map[string]string{
	"images": `make images
CGO_ENABLED=0 go build -trimpath -ldflags=-s -o bin/nats-server github.com/nats-io/nats-server/v2
go run ./cmd/mkimage --out bin/images/nats.tar --ref pdserve.local/k8se2e/nats:2.15.3 --base none \
  --add bin/nats-server:/nats-server --entrypoint /nats-server --user 65532:65532
make k8s-up`,
	"model": `mkdir -p "$MODELS"
go run ./cmd/mkgguf --shape tiny-llama --type f16 --out "$MODELS/tiny-llama.gguf"`,
	"secrets": `kubectl create namespace pdserve
mkdir -p .pdserve && KEY=$(openssl rand -hex 24)
printf %s "$KEY" | go run ./cmd/coordinator hash-key --name e2e > .pdserve/api-keys
kubectl -n pdserve create secret generic pdserve-api-keys --from-file=api-keys=.pdserve/api-keys
kubectl -n pdserve create secret generic pdserve-test-key --from-literal=api-key="$KEY"`,
	"install": `helm install pd helm/pdserve -n pdserve -f helm/pdserve/ci/k8s-e2e-values.yaml \
  --set image.registry="$REGISTRY" --set model.hostPath.path="$MODELS"
kubectl -n pdserve wait pod -l app.kubernetes.io/instance=pd --for=condition=Ready --timeout=10m`,
	"test": `helm test pd -n pdserve --logs`,
	"upgrade": `helm upgrade pd helm/pdserve -n pdserve --reuse-values \
  --set-string prefillWorker.podAnnotations.rollout=2 --set-string decodeWorker.podAnnotations.rollout=2 \
  --wait --timeout 5m`,
	"uninstall": `helm uninstall pd -n pdserve --wait`,
	"nodes": `kubectl label node $PREFILL_NODES pdserve.io/pool=prefill --overwrite
kubectl taint node $PREFILL_NODES pdserve.io/pool=prefill:NoSchedule --overwrite
kubectl label node $DECODE_NODES pdserve.io/pool=decode --overwrite
kubectl taint node $DECODE_NODES pdserve.io/pool=decode:NoSchedule --overwrite`,
	"gpu-dry-run": `KV=$(kubectl get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
helm template pg helm/pdserve -n pdserve-gpu --kube-version "$KV" \
  -f helm/pdserve/ci/gpu-two-pools-values.yaml --set image.registry="$REGISTRY" > .pdserve/pg.yaml
kubectl create namespace pdserve-gpu
kubectl apply --dry-run=server -n pdserve-gpu -f .pdserve/pg.yaml`,
}

// docMarker precedes each shell block of docs/kubernetes.md that the e2e
// runs; readmetest reads it as a skipped recipe (the e2e, not readmetest,
// runs it).
var docMarker = regexp.MustCompile(`^<!-- recipe: skip \(make k8s-e2e runs it: ([a-z0-9-]+)\) -->$`)

// TestDocCommands: the commands docs/kubernetes.md shows for the e2e
// cluster are exactly those the e2e runs (docCommands), block by block,
// and every one of docCommands is shown. It needs no cluster.
func TestDocCommands(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repotest.Root(t), "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	got := map[string]string{}
	for i := 0; i < len(lines); i++ {
		m := docMarker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		if i+1 >= len(lines) || lines[i+1] != "```sh" {
			t.Fatalf("docs/kubernetes.md:%d: marker %s not followed by a ```sh fence", i+1, m[1])
		}
		var block []string
		for i += 2; i < len(lines) && lines[i] != "```"; i++ {
			block = append(block, lines[i])
		}
		if _, dup := got[m[1]]; dup {
			t.Errorf("docs/kubernetes.md: block %s twice", m[1])
		}
		got[m[1]] = strings.Join(block, "\n")
	}
	if diff := cmp.Diff(docCommands, got); diff != "" {
		t.Errorf("docs/kubernetes.md's e2e blocks differ from docCommands (-e2e +docs):\n%s", diff)
	}
	if len(got) == 0 {
		t.Error("docs/kubernetes.md has no block the e2e runs")
	}
}
