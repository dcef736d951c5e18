#!/usr/bin/env bash
# Imports the image tarballs of `make images` (bin/images, or $1) into a
# containerd of its own (a private root, state and socket: the machine's
# containerd, if any, is not touched) and runs them with runc, read-only,
# as the images' user: every binary's --version, and the CUDA worker
# without a GPU, which must say so in one line and exit 1. Needs root,
# containerd and runc (Debian packages containerd, runc).
set -euo pipefail
dir=${1:-bin/images}
for c in containerd ctr runc; do
  command -v "$c" >/dev/null || { echo "images-ctr: $c is required (apt-get install containerd runc)" >&2; exit 1; }
done
work=$(mktemp -d)
sock=$work/containerd.sock
cat > "$work/config.toml" <<EOF
version = 2
root = "$work/root"
state = "$work/state"
[grpc]
  address = "$sock"
[plugins."io.containerd.grpc.v1.cri"]
  disable = true
EOF
containerd --config "$work/config.toml" > "$work/containerd.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ctr() { command ctr --address "$sock" -n pdserve-images "$@"; }
for _ in $(seq 100); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done
ctr version >/dev/null || { cat "$work/containerd.log" >&2; exit 1; }
# overlayfs where the kernel has it (one unpacked copy of each image),
# else native (a copy per container).
snap=native
grep -qw overlay /proc/filesystems && snap=overlayfs

run() { # IMAGE NAME ARGS...: runs ARGS in IMAGE, read-only, the image's user
  local image=$1 name=$2; shift 2
  ctr run --rm --snapshotter "$snap" --read-only \
    --mount "type=bind,src=$work/model.gguf,dst=/models/m.gguf,options=rbind:ro" "$image" "$name" "$@" < /dev/null
}
: > "$work/model.gguf"; chmod 644 "$work/model.gguf"
while read -r name ref digest _; do
  ctr images import --snapshotter "$snap" "$dir/$name.tar" >/dev/null < /dev/null
  got=$(ctr images ls -q | grep -Fx "$ref" || true)
  [ "$got" = "$ref" ] || { echo "images-ctr: $name.tar did not import as $ref" >&2; exit 1; }
  case $name in
    loadtest) bins=pdserve-loadtest ;;
    worker-*) bins="coordinator prefill-worker decode-worker" ;;
    *) bins=$name ;;
  esac
  for b in $bins; do
    printf '%-15s %s\n' "$name:" "$(run "$ref" "v-$name-$b" "/usr/local/bin/$b" --version)"
  done
done < "$dir/images.txt"
if grep -q '^worker-cuda ' "$dir/images.txt"; then
  ref=$(awk '$1 == "worker-cuda" {print $2}' "$dir/images.txt")
  set +e
  out=$(run "$ref" nogpu /usr/local/bin/prefill-worker --engine llamacpp --model /models/m.gguf 2>&1)
  rc=$?
  set -e
  last=$(printf '%s\n' "$out" | tail -1)
  echo "worker-cuda without a GPU (exit $rc): $last"
  [ "$rc" = 1 ] && [[ $last == "prefill-worker: no GPU: "* ]] || { echo "images-ctr: want exit 1 and one 'no GPU' line" >&2; exit 1; }
fi
echo "images-ctr: every image imported into containerd and ran"
