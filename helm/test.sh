#!/usr/bin/env bash
# Lint and render the pdserve chart over the values matrix in
# helm/pdserve/ci/*-values.yaml (engines ref, sim and llamacpp; GPU and
# CPU-only; disaggregated and colocated), and check that the schema rejects
# the bad values files in helm/testdata/bad/. helm is the version pinned as a tool in
# go.mod (`go tool helm`), built from the module cache: nothing is downloaded
# at run time besides Go modules.
#
# Usage: helm/test.sh   (from anywhere; KUBE_VERSION overrides the
# Kubernetes version rendered for, default 1.33.0: a Helm built from
# source assumes Kubernetes 1.20 without --kube-version, which the chart's
# kubeVersion, >=1.30, refuses)
set -euo pipefail
cd "$(dirname "$0")/.."

chart=helm/pdserve
kube="${KUBE_VERSION:-1.33.0}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Built once, into bin/helm (ignored by git; go build relinks it only when
# it is out of date), with go build rather than go tool: each `go tool
# helm` would load the module graph and hash Helm's sources again (0.6 s
# here, 87 calls), and go tool ignores GOFLAGS, so under .ci/run's flags
# it compiled Helm and its dependencies a second time beside go vet's and
# the k8s e2e's builds of them (alone: 197 s, 378 s of CPU, cold on 2
# cores). -w: no DWARF, a faster link.
go build -ldflags=-w -o bin/ helm.sh/helm/v3/cmd/helm
helm_bin="$PWD/bin/helm"
helm() { "$helm_bin" "$@"; }

echo "helm $(helm version --template '{{.Version}}'), Kubernetes $kube"
passed=0
failed=0
check() { # name, command...
	local name="$1"
	shift
	if "$@" >"$out/log" 2>&1; then
		passed=$((passed + 1))
		echo "ok   $name"
	else
		failed=$((failed + 1))
		echo "FAIL $name"
		sed 's/^/     /' "$out/log"
	fi
}
rejects() { # a command that must fail with a schema error
	if "$@" >"$out/reject" 2>&1; then
		echo "accepted, want a schema error"
		return 1
	fi
	grep -q "values don't meet the specifications of the schema" "$out/reject" || {
		cat "$out/reject"
		return 1
	}
}

renders_gpu() { # resource, helm template flags...: the workers request GPUs as that resource only
	local res="$1"
	shift
	helm template pd "$chart" -n pdserve --kube-version "$kube" "$@" >"$out/gpu.yaml"
	grep -q "^ *$res: 2\$" "$out/gpu.yaml" || {
		echo "no worker requests $res"
		return 1
	}
	if [ "$res" != nvidia.com/gpu ] && grep -q '^ *nvidia.com/gpu: ' "$out/gpu.yaml"; then
		echo "a container still requests nvidia.com/gpu"
		return 1
	fi
}

check "lint defaults" helm lint --strict --kube-version "$kube" "$chart"
check "template defaults" helm template pd "$chart" -n pdserve --kube-version "$kube" --output-dir "$out/defaults"
for f in "$chart"/ci/*-values.yaml; do
	name="$(basename "$f" -values.yaml)"
	check "lint $name" helm lint --strict --kube-version "$kube" -f "$f" "$chart"
	check "template $name" helm template pd "$chart" -n pdserve --kube-version "$kube" -f "$f" --output-dir "$out/$name"
done
# Settings no values file of the matrix covers, as --set over one of them.
check "template llamacpp-cpu, model downloaded into an emptyDir" helm template pd "$chart" -n pdserve --kube-version "$kube" \
	-f "$chart/ci/llamacpp-cpu-values.yaml" --set model.source=download \
	--set model.download.url=https://models.example.com/qwen2.5-0.5b-q8_0.gguf --set model.download.sizeLimit=2Gi \
	--output-dir "$out/llamacpp-download"
check "template gpu-two-pools on AMD GPUs (gpuResource=amd.com/gpu)" renders_gpu amd.com/gpu \
	-f "$chart/ci/gpu-two-pools-values.yaml" --set gpuResource=amd.com/gpu
# The two regions of docs/regions.md (not in ci/ until the coordinator
# has the --region flags that helm/charttest checks every ci release for).
for f in helm/testdata/regions/*-values.yaml; do
	check "template region $(basename "$f" -values.yaml)" helm template pd "$chart" -n pdserve --kube-version "$kube" -f "$f" --output-dir "$out/region-$(basename "$f" -values.yaml)"
done
for f in helm/testdata/bad/*.yaml; do
	check "schema rejects $(basename "$f" .yaml)" rejects helm template pd "$chart" --kube-version "$kube" -f "$f"
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
