// Package ociimage assembles OCI container images from files on this
// machine, with no container engine and no container registry, and
// writes them as tarballs that container tools import.
//
// An image is a Spec: layers, each a Tree of files (host files and
// directories added as Docker's COPY does, or bytes), bottom first, and
// the runtime configuration (entrypoint, default arguments, user, env,
// labels, working directory, exposed ports). Build writes each layer as a
// gzip-compressed tar whose entries are sorted by path, owned by numeric
// ids, and stamped with one time (Spec.Created: SOURCE_DATE_EPOCH, the
// commit's time, or the Unix epoch); the config and history carry the same
// time. So the same inputs give the same layer, config and manifest
// digests, on any machine with the same Go module versions.
//
// WriteArchive writes one image as a tar that is both an OCI image layout
// (index.json naming the image for containerd and for OCI tools) and a
// docker-archive (manifest.json): `ctr images import`, `skopeo copy
// oci-archive:`, `crane push`, `docker load` and `podman load` read it.
//
// GlibcBase is the base layer for dynamically linked programs (pdserve's
// binaries are, because they load llama.cpp through purego): glibc,
// libstdc++, libgcc, CA certificates and time zone data from the Debian
// packages pinned in debian.lock (version and SHA-256 each), fetched with
// apt-get download into CacheDir and unpacked with dpkg-deb, plus the
// files their maintainer scripts or base-files would make (the CA bundle,
// /etc/passwd and /etc/group with the non-root user 65532, nsswitch.conf,
// os-release, /tmp). Nothing in it writes outside /tmp and the user's home,
// so the images run with a read-only root file system.
//
// CheckELF checks, file by file, that every ELF program and library of an
// image finds its interpreter and its DT_NEEDED libraries inside the
// image, as glibc's loader searches for them.
//
// The pdserve images (coordinator, prefill-worker, decode-worker,
// loadtest, worker-cpu, worker-cuda) are PdserveOptions.PdserveImage's
// recipes; worker-cuda adds the CUDA runtime from Debian's non-free
// packages and the CUDA build of llama.cpp from the npm packages pinned
// in npm.lock. `make images` runs them through cmd/mkimage, which also
// builds any other image from flags. With Spec.LayerCache set, compressed
// layers are kept by content and reused by later builds.
package ociimage
