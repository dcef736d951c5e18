#!/usr/bin/env bash
# Installs llama.cpp for the llamacpp engine and its tests, from the npm
# packages of node-llama-cpp (MIT), pinned to one release because llama.cpp's
# C API changes between releases:
#   third_party/llama/lib     the prebuilt shared libraries for this machine
#                             (libllama, libggml*, one CPU backend per family)
#   third_party/llama/vocab   vocab-only GGUFs of real tokenizers with their
#                             test vectors (.inp/.out), from llama.cpp's source
#   third_party/llama/include llama.h of that source, for reference
#   third_party/llama/src     the source itself (a git clone of the bundle), to
#                             build llama.cpp yourself (CUDA, ROCm; see README)
# No package script runs. Re-running is a no-op once the stamp exists; after
# that nothing here needs the network.
set -euo pipefail
cd "$(dirname "$0")/.."
version=3.21.1
dir=third_party/llama
stamp=$dir/.installed-$version
[ -f "$stamp" ] && exit 0

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) pkg=linux-x64 ;;
  Linux-aarch64) pkg=linux-arm64 ;;
  *) echo "install-llama: no prebuilt llama.cpp package for $(uname -s)-$(uname -m); build llama.cpp yourself and pass --llama-lib DIR" >&2; exit 1 ;;
esac
command -v npm >/dev/null || { echo "install-llama: npm is required (Debian package npm, or Node.js)" >&2; exit 1; }
command -v git >/dev/null || { echo "install-llama: git is required" >&2; exit 1; }

rm -rf "$dir"
mkdir -p "$dir/npm" "$dir/lib" "$dir/vocab" "$dir/include"
npm i --prefix "$dir/npm" -E --omit=optional --ignore-scripts --no-audit --no-fund \
  "node-llama-cpp@$version" "@node-llama-cpp/$pkg@$version" >/dev/null
bins=$dir/npm/node_modules/@node-llama-cpp/$pkg/bins/$pkg
[ -d "$bins" ] || bins=$(dirname "$(find "$dir/npm/node_modules/@node-llama-cpp/$pkg" -name 'libllama*.so' | head -1)")
cp "$bins"/*.so "$dir/lib/"

bundle=$dir/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
git -c advice.detachedHead=false clone -q "$bundle" "$dir/src"
cp "$dir"/src/models/ggml-vocab-*.gguf* "$dir/vocab/"
cp "$dir/src/include/llama.h" "$dir/include/"
git -C "$dir/src" rev-parse HEAD > "$dir/COMMIT"
echo "$version" > "$stamp"
echo "install-llama: llama.cpp $(cut -c1-12 "$dir/COMMIT") (node-llama-cpp $version) in $dir"
