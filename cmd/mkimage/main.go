// Command mkimage builds OCI container images from files on this machine,
// with no container engine and no container registry, as tarballs that
// `ctr images import`, `skopeo copy oci-archive:…`, `crane push`, `docker
// load` and `podman load` accept (see package internal/ociimage).
//
// Any image, from flags (each --add is one layer, above the base):
//
//	mkimage --out bin/pause.tar --ref registry.k8s.io/pause:3.10 --base none \
//	    --add /tmp/pause:/pause --entrypoint /pause --user 65535:65535
//	mkimage --out bin/coredns.tar --ref registry.k8s.io/coredns/coredns:v1.12.0 \
//	    --base none --add /tmp/coredns:/coredns --entrypoint /coredns \
//	    --expose 53/udp --expose 53/tcp --user 0:0
//	mkimage --out bin/x.tar --ref example.com/x:1 --add bin/x:/usr/local/bin/ \
//	    --entrypoint /usr/local/bin/x --arg --listen --arg :8080 \
//	    --env TZ=UTC --label org.opencontainers.image.source=https://example.com/x \
//	    --workdir /home/nonroot --expose 8080
//
// --base glibc (the default) puts the glibc base of internal/ociimage
// underneath (Debian's libc6, libstdc++6, libgcc-s1, ca-certificates and
// tzdata at the versions of debian.lock, user 65532); --base none starts
// from nothing, for static binaries. Timestamps are SOURCE_DATE_EPOCH's
// (or the epoch): the same inputs give the same digests.
//
// pdserve's own images (what `make images` runs), into bin/images:
//
//	mkimage pdserve --out-dir bin/images [--only coordinator,worker-cpu]
//
// Re-pin the Debian packages when the archive has dropped a pinned version:
//
//	mkimage pin
//
// Run it with --help (or COMMAND --help) for every flag.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return mkimage(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
