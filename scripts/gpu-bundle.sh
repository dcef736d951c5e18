#!/usr/bin/env bash
# Prepares .gpu/ (ignored by git), the one folder scripts/gpu-check.sh needs
# on a GPU node besides the working tree (docs/gpu.md):
#   .gpu/bundle.tar.xz   bin/        coordinator, mkgguf, gpucheck, built with
#                                    CGO_ENABLED=0 (no C toolchain, no cgo; they
#                                    load llama.cpp at run time with purego, so
#                                    they need the node's C library and dynamic
#                                    loader, nothing else)
#                        llama-src/  the pinned llama.cpp commit pruned to what
#                                    libllama with the CPU and CUDA backends
#                                    builds from: the CMake files, ggml (its core,
#                                    ggml-cpu, ggml-cuda), llama (include, src),
#                                    common, vendor, the licenses
#                        vocab/      Llama 3's tokenizer (ggml-vocab-llama-bpe.gguf)
#                        COMMIT      the llama.cpp commit
# It prints the bundle's size, the tracked tree's and their sum, and fails
# when the sum reaches 64 MiB (what a lent GPU machine receives in all).
# Needs Go, git, tar and xz; runs `make llama` first when the source is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
src=third_party/llama/src
[ -d "$src/.git" ] || [ -f "$src/.git" ] || make llama
out=.gpu
stage=$out/stage
rm -rf "$out"
mkdir -p "$stage/bin" "$stage/vocab" "$stage/llama-src"
trap 'rm -rf "$stage"' EXIT

CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$stage/bin/" ./cmd/coordinator ./cmd/mkgguf ./cmd/gpucheck
cp third_party/llama/vocab/ggml-vocab-llama-bpe.gguf "$stage/vocab/"
commit=$(git -C "$src" rev-parse HEAD)
[ "$commit" = "$(cat third_party/llama/COMMIT)" ] || { echo "gpu-bundle: $src is at $commit, not the pinned $(cat third_party/llama/COMMIT)" >&2; exit 1; }
echo "$commit" > "$stage/COMMIT"
# git archive of the commit itself: nothing a local build left in the
# source tree comes along. ':(glob)ggml/src/*' is ggml/src's own files.
git -C "$src" archive --format=tar HEAD -- CMakeLists.txt LICENSE licenses cmake include src common vendor \
  ggml/CMakeLists.txt ggml/cmake ggml/include ':(glob)ggml/src/*' ggml/src/ggml-cpu ggml/src/ggml-cuda |
  tar -xf - -C "$stage/llama-src"

tar -C "$stage" -cf - COMMIT bin vocab llama-src | xz -T0 -6 > "$out/bundle.tar.xz"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
bundle=$(stat -c %s "$out/bundle.tar.xz")
tracked=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
total=$((bundle + tracked))
echo "gpu-bundle: $out/bundle.tar.xz $(mib "$bundle") (binaries $(du -sb "$stage/bin" | cut -f1 | xargs -I{} awk 'BEGIN{printf "%.1f", {}/1048576}') MiB and llama.cpp $(cut -c1-12 "$stage/COMMIT") source $(du -sb "$stage/llama-src" | cut -f1 | xargs -I{} awk 'BEGIN{printf "%.1f", {}/1048576}') MiB before xz)"
echo "gpu-bundle: tracked tree $(mib "$tracked"); bundle + tracked tree $(mib "$total") of the 64 MiB a GPU machine receives"
if [ "$total" -ge $((64 * 1048576)) ]; then
  echo "gpu-bundle: too large: bundle + tracked tree must stay under 64 MiB" >&2
  exit 1
fi
