# syntax=docker/dockerfile:1
#
# Small static images for pdserve's three binaries and the load generator,
# one target each:
#
#   docker build --target coordinator    -t ghcr.io/pdserve/coordinator:0.1.0 .
#   docker build --target prefill-worker -t ghcr.io/pdserve/prefill-worker:0.1.0 .
#   docker build --target decode-worker  -t ghcr.io/pdserve/decode-worker:0.1.0 .
#   docker build --target loadtest       -t ghcr.io/pdserve/loadtest:0.1.0 .
#
# The binaries are built once, in the shared build stage, with CGO off, so
# they are fully static; the runtime images hold nothing else but CA
# certificates and time zone data (distroless static), run as the non-root
# user 65532 and need no writable root filesystem. Build for another
# architecture with --platform (e.g. linux/arm64): Go cross-compiles, no
# emulation needed.

ARG GO_VERSION=1.26

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

FROM gcr.io/distroless/static-debian12:nonroot AS runtime
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

# Last, so that a plain `docker build .` gives the coordinator.
FROM runtime AS coordinator
COPY --from=build /out/coordinator /usr/local/bin/coordinator
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/coordinator"]
