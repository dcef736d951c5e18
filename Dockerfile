# syntax=docker/dockerfile:1
#
# Images of pdserve, one target each:
#
#   docker build --target coordinator    -t ghcr.io/pdserve/coordinator:0.1.0 .
#   docker build --target prefill-worker -t ghcr.io/pdserve/prefill-worker:0.1.0 .
#   docker build --target decode-worker  -t ghcr.io/pdserve/decode-worker:0.1.0 .
#   docker build --target loadtest       -t ghcr.io/pdserve/loadtest:0.1.0 .
#   docker build --target worker-cpu     -t ghcr.io/pdserve/worker-cpu:0.1.0 .
#   docker build --target worker-cuda    -t ghcr.io/pdserve/worker-cuda:0.1.0 .
#
# The binaries are built once, in the shared build stage, with CGO off. The
# first four images run the ref and sim engines: they hold nothing but the
# one binary, CA certificates, time zone data and glibc (distroless base,
# without OpenSSL), run as the non-root user 65532 and need no writable root
# filesystem. glibc is there because the binaries load llama.cpp at run
# time through purego, which makes them dynamically linked even with CGO
# off, so a distroless *static* image cannot start them; without the
# llama.cpp libraries they still run every other engine.
#
# worker-cpu and worker-cuda add llama.cpp for `--engine llamacpp` and hold
# all three binaries (the chart's pods name theirs as the command); the
# libraries are in /opt/pdserve/llama/lib, which PDSERVE_LLAMA_LIB names:
#   worker-cpu   the prebuilt CPU libraries that `make llama` installs (the
#                pinned node-llama-cpp@3.21.1 packages), on distroless cc
#                (glibc, libstdc++); also the coordinator's image with
#                llamacpp, which loads only the model's vocabulary.
#   worker-cuda  llama.cpp built with CUDA from the same pinned source (the
#                git bundle in node-llama-cpp@3.21.1) on nvidia/cuda devel,
#                run on nvidia/cuda runtime. Its backends load at run time
#                (GGML_BACKEND_DL), so on a node without a GPU it falls back
#                to the CPU. Match CUDA_VERSION to the nodes' driver (CUDA
#                12.8 needs driver 570 or newer, or 525 with CUDA's minor
#                version compatibility) and CUDA_ARCHITECTURES to their GPUs
#                (75 T4, 80 A100, 86 A10/A40, 89 L4/L40S, 90 H100/H200,
#                100 B200, 120 RTX PRO 6000 Blackwell; 100 and 120 need
#                CUDA 12.8).
#
# These targets were written where no Docker engine runs, so none of them
# has been built from this file: treat the first build as its test.
#
# Build for another architecture with --platform (e.g. linux/arm64): Go
# cross-compiles without emulation; the llama.cpp stages run on the target
# platform (npm picks the prebuilt package of the architecture it runs on).

ARG GO_VERSION=1.26
ARG NODE_VERSION=20
ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=24.04

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
# Set by BuildKit from --platform (default: the builder's own platform).
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
COPY . .
# The cache mounts keep downloaded modules and compiled packages between
# builds; the build fetches only the modules these four programs import.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags='-s -w' -o /out/ \
        ./cmd/coordinator ./cmd/prefill-worker ./cmd/decode-worker ./loadtest

# llama: the pinned llama.cpp exactly as `make llama` installs it, into
# /src/third_party/llama/{lib,src,...}: the prebuilt CPU libraries and the
# source of the same release. The node image has npm and git.
FROM node:${NODE_VERSION}-bookworm AS llama
WORKDIR /src
COPY scripts/install-llama.sh scripts/
RUN --mount=type=cache,target=/root/.npm bash scripts/install-llama.sh

# llama-cuda: the pinned source built with CUDA: libllama, libggml,
# libggml-base, the CUDA backend and one CPU backend per CPU family, into
# /out/lib (the libraries only: no tools, tests, server or curl). Without
# OpenMP, as the prebuilt CPU libraries: ggml's own thread pool, no libgomp.
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS llama-cuda
ARG CUDA_ARCHITECTURES="75;80;86;89;90;100;120"
RUN apt-get update && apt-get install -y --no-install-recommends cmake build-essential \
    && rm -rf /var/lib/apt/lists/*
COPY --from=llama /src/third_party/llama/src /llama
WORKDIR /llama
RUN cmake -B build -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
        -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_OPENMP=OFF \
        -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
    && cmake --build build --config Release --target llama -j"$(nproc)" \
    && mkdir -p /out/lib && cp -P build/bin/*.so* /out/lib/

FROM gcr.io/distroless/base-nossl-debian12:nonroot AS runtime
USER 65532:65532

FROM runtime AS loadtest
COPY --from=build /out/loadtest /usr/local/bin/pdserve-loadtest
ENTRYPOINT ["/usr/local/bin/pdserve-loadtest"]

FROM runtime AS decode-worker
COPY --from=build /out/decode-worker /usr/local/bin/decode-worker
EXPOSE 9000 9090
ENTRYPOINT ["/usr/local/bin/decode-worker"]

FROM runtime AS prefill-worker
COPY --from=build /out/prefill-worker /usr/local/bin/prefill-worker
EXPOSE 9000 9090
ENTRYPOINT ["/usr/local/bin/prefill-worker"]

# worker-cpu: the three binaries and the prebuilt CPU llama.cpp. No
# entrypoint: run /usr/local/bin/{prefill-worker,decode-worker,coordinator}.
FROM gcr.io/distroless/cc-debian12:nonroot AS worker-cpu
COPY --from=llama /src/third_party/llama/lib/ /opt/pdserve/llama/lib/
COPY --from=build /out/coordinator /out/prefill-worker /out/decode-worker /usr/local/bin/
ENV PDSERVE_LLAMA_LIB=/opt/pdserve/llama/lib
USER 65532:65532
EXPOSE 8080 9000 9090

# worker-cuda: the three binaries and the CUDA llama.cpp. The NVIDIA
# container runtime mounts the driver (libcuda) when the pod has a GPU.
# No entrypoint of ours: run /usr/local/bin/{prefill-worker,decode-worker}.
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS worker-cuda
COPY --from=llama-cuda /out/lib/ /opt/pdserve/llama/lib/
COPY --from=build /out/coordinator /out/prefill-worker /out/decode-worker /usr/local/bin/
ENV PDSERVE_LLAMA_LIB=/opt/pdserve/llama/lib
USER 65532:65532
EXPOSE 8080 9000 9090

# Last, so that a plain `docker build .` gives the coordinator.
FROM runtime AS coordinator
COPY --from=build /out/coordinator /usr/local/bin/coordinator
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/coordinator"]
