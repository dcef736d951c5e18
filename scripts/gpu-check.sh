#!/usr/bin/env bash
# The GPU check (docs/gpu.md): run from the repository root with .gpu/ of
# `make gpu-bundle` beside it. Needs no Go and no network.
#   1. builds libllama and libggml with the CUDA backend for sm_90 (H100,
#      H200) from the bundle's pinned llama.cpp source, with the device's
#      nvcc, and prints the build time;
#   2. writes a random-weight GGUF of Llama-3-8B's shape (32 layers, hidden
#      4096, 32 heads, 8 KV heads, FFN 14336, Llama 3's 128256-token
#      tokenizer) in q8_0, while step 1 builds;
#   3. serves it standalone (coordinator --standalone --engine llamacpp,
#      --llama-device gpu, both pools in one process on the one GPU),
#      disaggregated then colocated: TTFT at 512, 2048 and 8192 prompt
#      tokens, decode tokens/s at batch 1, 16 and 64, the KV bytes and
#      transfer time of each request, whether greedy text is the same in
#      both modes (cmd/gpucheck);
#   4. runs coordinator profile --engine llamacpp for a short budget;
#   5. writes gpucheck.json, profile.json, the logs and build.json under
#      $OUT, and ends within --budget seconds (540) of its start: a step
#      that would not finish is skipped and named in gpucheck.json.
#
# --cpu is the dry run: it builds the CPU backend alone from the same
# source (fast flags: -O0, no llamafile or repack kernels; the build is
# kept in the work directory and reused, and is not counted in --budget),
# and runs steps 2-5 on a tiny model of the same architecture and
# tokenizer, with prompts, batches and budgets scaled down.
#
# Needs: tar and xz (or python3) to unpack the bundle; cmake (3.18 or newer)
# and ninja or make; a C and C++ compiler; with CUDA, nvcc (on PATH, in
# $CUDA_HOME, in /usr/local/cuda, or in the nvidia-* Python packages) and
# cuBLAS. On Debian or Ubuntu: apt-get install -y cmake ninja-build g++ xz-utils.
#
# Usage: scripts/gpu-check.sh [--cpu] [--no-fa] [--llama-lib DIR] [--budget SECONDS] [--out DIR] [--jobs N]
#   --no-fa   build the CUDA backend without flash attention's kernels (see
#             docs/gpu.md: the engine always runs flash attention, so
#             without them llama.cpp runs attention on the CPU)
#   --llama-lib DIR  skip step 1 and serve with the llama.cpp libraries of
#             DIR (a build of the same commit, e.g. one made earlier)
#   OUT (env) or --out: where results go (default results/gpu-check)
#   GPU_CHECK_WORK (env): work directory (default ${TMPDIR:-/tmp}/pdserve-gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

cpu=0 fa=ON lib="" budget=540 out=${OUT:-results/gpu-check} jobs=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu=1 ;;
    --no-fa) fa=OFF ;;
    --llama-lib) lib=$(cd "$2" && pwd); shift ;;
    --budget) budget=$2; shift ;;
    --out) out=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${GPU_CHECK_WORK:-${TMPDIR:-/tmp}/pdserve-gpu-check}
mkdir -p "$work"
log() { printf 'gpu-check: [%4ds] %s\n' "$(($(date +%s) - start))" "$*"; }
left() { echo $((deadline - $(date +%s))); }
deadline=$((start + budget))

# The step outcomes, written as build.json whatever happens.
declare -A meta=([mode]=$([ $cpu = 1 ] && echo cpu || echo cuda) [budget_s]=$budget)
write_meta() {
  { echo "{"; local first=1 k
    for k in "${!meta[@]}"; do
      [ $first = 1 ] || echo ","
      first=0
      printf '  "%s": "%s"' "$k" "$(printf '%s' "${meta[$k]}" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n' ' ')"
    done
    echo; echo "}"; } > "$out/build.json"
}
fail() { meta[error]=$*; write_meta; echo "gpu-check: $*" >&2; exit 1; }

# --- what the script needs
need=()
for c in cmake tar; do command -v $c >/dev/null || need+=("$c"); done
command -v ninja >/dev/null || command -v make >/dev/null || need+=("ninja or make")
command -v c++ >/dev/null || command -v g++ >/dev/null || need+=("a C++ compiler")
command -v xz >/dev/null || command -v python3 >/dev/null || need+=("xz or python3")
[ ${#need[@]} = 0 ] || fail "missing: ${need[*]} (Debian/Ubuntu: apt-get install -y cmake ninja-build g++ xz-utils)"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)

# --- unpack the bundle (again only when it changed)
bundle=.gpu/bundle.tar.xz
[ -f "$bundle" ] || fail "$bundle missing: run make gpu-bundle first (and carry .gpu/)"
meta[bundle_bytes]=$(stat -c %s "$bundle")
sum=$(cksum < "$bundle")
if [ "$(cat "$work/bundle.cksum" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$work/bin" "$work/vocab" "$work/llama-src" "$work/COMMIT" "$work"/build-*
  if command -v xz >/dev/null; then
    tar -xJf "$bundle" -C "$work"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$bundle" "$work"
  fi
  echo "$sum" > "$work/bundle.cksum"
fi
commit=$(cat "$work/COMMIT")
meta[llama_commit]=$commit
log "bundle $bundle ($(awk -v b="${meta[bundle_bytes]}" 'BEGIN{printf "%.1f MiB", b/1048576}')), llama.cpp ${commit:0:12}, work in $work"

# --- step 1: build
common_cmake=(-DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_COMMIT="${commit:0:8}" -DLLAMA_BUILD_NUMBER=0)
ld_extra="" shim=""
if [ $cpu = 1 ]; then
  build=$work/build-cpu
  cmake_args=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-O0 -g0" "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g0"
    -DGGML_NATIVE=OFF -DGGML_LLAMAFILE=OFF -DGGML_CPU_REPACK=OFF -DGGML_OPENMP=OFF)
  meta[flash_attn_kernels]=cpu
else
  build=$work/build-cuda
  if [ -z "$lib" ]; then
    # nvcc: PATH, $CUDA_HOME, /usr/local/cuda, else the nvidia Python packages.
    nvcc=$(command -v nvcc || true)
    for d in "${CUDA_HOME:-}" /usr/local/cuda; do
      [ -z "$nvcc" ] && [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && nvcc=$d/bin/nvcc
    done
    if [ -z "$nvcc" ] && command -v python3 >/dev/null; then
      nvcc=$(python3 -c 'import glob, os, site
for r in site.getsitepackages() + [site.getusersitepackages()]:
    for p in sorted(glob.glob(os.path.join(r, "nvidia", "**", "bin", "nvcc"), recursive=True)):
        print(p); raise SystemExit' 2>/dev/null || true)
    fi
    [ -n "$nvcc" ] || fail "nvcc not found (PATH, \$CUDA_HOME, /usr/local/cuda, nvidia Python packages)"
    cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
    meta[nvcc]=$nvcc
    meta[nvcc_version]=$("$nvcc" --version | tail -2 | head -1)
    # The Python packages ship libcublas.so.13 and friends without the
    # unversioned names CMake links against, and may split the toolkit over
    # several nvidia/* folders: gather one toolkit root of links.
    shim=$work/cuda-root
    rm -rf "$shim"; mkdir -p "$shim/bin" "$shim/include" "$shim/lib64"
    ln -s "$(readlink -f "$nvcc")" "$shim/bin/nvcc"
    search=("$cuda_root")
    case "$cuda_root" in */site-packages/nvidia/*) search+=("${cuda_root%%/site-packages/nvidia/*}/site-packages/nvidia") ;; esac
    for inc in $(find "${search[@]}" -type d -name include 2>/dev/null); do
      for f in "$inc"/*; do [ -e "$shim/include/$(basename "$f")" ] || ln -s "$f" "$shim/include/"; done
    done
    for f in $(find "${search[@]}" \( -name 'lib*.so*' -o -name '*.a' \) \( -path '*/lib/*' -o -path '*/lib64/*' \) 2>/dev/null); do
      b=$(basename "$f")
      [ -e "$shim/lib64/$b" ] || ln -s "$f" "$shim/lib64/$b"
      u=${b%%.so*}.so
      case $b in *.so.*) [ -e "$shim/lib64/$u" ] || ln -s "$f" "$shim/lib64/$u" ;; esac
    done
    for f in "$cuda_root"/bin/*; do [ -e "$shim/bin/$(basename "$f")" ] || ln -s "$f" "$shim/bin/"; done
    # nvvm (cicc, libdevice) must sit beside bin/ for nvcc.
    [ -d "$cuda_root/nvvm" ] && ln -s "$cuda_root/nvvm" "$shim/nvvm"
    export CUDACXX=$shim/bin/nvcc PATH=$shim/bin:$PATH
    ld_extra=$shim/lib64
  fi
  cmake_args=(-DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA="$fa"
    -DGGML_NATIVE=ON -DCUDAToolkit_ROOT="$shim" -DCMAKE_CUDA_COMPILER="$shim/bin/nvcc")
  meta[flash_attn_kernels]=$fa
  meta[cuda_architectures]=90
  if command -v nvidia-smi >/dev/null; then
    meta[gpu]=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
    log "GPU: ${meta[gpu]}"
  fi
fi
[ -n "$lib" ] || lib=$build/bin
meta[llama_lib]=$lib
export LD_LIBRARY_PATH=$lib${ld_extra:+:$ld_extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# --- step 2 starts now, beside the build: the model.
if [ $cpu = 1 ]; then
  model=$work/tiny-llama3-q8_0.gguf
  shape=(--name random-tiny-llama3 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128)
else
  model=$work/llama-3-8b-q8_0.gguf
  shape=(--name random-llama-3-8b --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336)
fi
# --ctx is the training context written into the file; 32768 lets an 8k
# prompt and its output fit whatever the engine's context checks.
mkgguf_args=(--arch llama --vocab "$work/vocab/ggml-vocab-llama-bpe.gguf" "${shape[@]}" --ctx 32768
  --rope-theta 500000 --rms-eps 1e-5 --type q8_0 --seed 1 --out "$model")
meta[model]="${shape[*]} q8_0"
gen_pid=""
if [ ! -f "$model.done" ]; then
  rm -f "$model"
  ( t=$(date +%s); "$work/bin/mkgguf" "${mkgguf_args[@]}" > "$out/mkgguf.log" 2>&1 && echo $(($(date +%s) - t)) > "$model.done" ) &
  gen_pid=$!
fi

if [ "$lib" != "$build/bin" ]; then
  log "build: skipped, serving with $lib (--llama-lib)"
  meta[build_s]=skipped
elif [ -f "$build/bin/.built" ]; then
  log "build: reusing $build"
  meta[build_s]=reused
else
  log "build: cmake ${cmake_args[*]}"
  t=$(date +%s)
  cmake -S "$work/llama-src" -B "$build" "${gen[@]}" "${common_cmake[@]}" "${cmake_args[@]}" > "$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log" >&2; fail "cmake configure failed (build.log)"; }
  # Step 1 gets what is left but 4 minutes (load, measure, profile) on
  # the GPU; the dry run's build is not timed.
  limit=$(( cpu == 1 ? 86400 : $(left) - 240 ))
  [ "$limit" -gt 30 ] || fail "no time left to build"
  if ! timeout "$limit" cmake --build "$build" --target llama -j "$jobs" >> "$out/build.log" 2>&1; then
    tail -30 "$out/build.log" >&2
    meta[build_s]=$(($(date +%s) - t))
    fail "build failed or passed its ${limit}s (build.log); steps 2-5 skipped: nothing to serve with"
  fi
  meta[build_s]=$(($(date +%s) - t))
  touch "$build/bin/.built"
  log "build: ${meta[build_s]} s (flash attention kernels: ${meta[flash_attn_kernels]})"
fi
ls "$lib"/lib*.so* > /dev/null 2>&1 || fail "no libraries in $lib"
meta[libraries]=$(cd "$lib" && ls lib*.so* | tr '\n' ' ')

if [ -n "$gen_pid" ]; then
  # The model may still be writing: wait, but not past the point where
  # nothing could be measured.
  while kill -0 "$gen_pid" 2>/dev/null; do
    if [ "$(left)" -lt 120 ]; then kill "$gen_pid"; fail "mkgguf did not finish in time"; fi
    sleep 1
  done
  wait "$gen_pid" || { cat "$out/mkgguf.log" >&2; fail "mkgguf failed (mkgguf.log)"; }
fi
meta[model_gen_s]=$(cat "$model.done")
meta[model_bytes]=$(stat -c %s "$model")
log "model: $model ($(awk -v b="${meta[model_bytes]}" 'BEGIN{printf "%.2f GB", b/1e9}'), written in ${meta[model_gen_s]} s)"

# --- steps 3-5
if [ $cpu = 1 ]; then
  # The dry run's own budget starts after its build.
  deadline=$(( $(date +%s) + budget ))
  check=(--prompt-tokens 64,256,1024 --batches 1,4,8 --decode-tokens 16 --ttft-output-tokens 8 --decode-prompt-tokens 32
    --ctx-size 4096 --max-seqs 8 --profile-budget 60s --load-timeout 120s --engine-args "--engine-threads ${jobs}")
else
  check=(--prompt-tokens 512,2048,8192 --batches 1,16,64 --decode-tokens 64 --ttft-output-tokens 16 --decode-prompt-tokens 128
    --ctx-size 32768 --max-seqs 64 --profile-budget 90s --load-timeout 150s --engine-args "--llama-device gpu")
fi
write_meta
metaflags=()
for k in "${!meta[@]}"; do metaflags+=(--meta "$k=${meta[$k]}"); done
log "measure: $(left) s left"
rc=0
"$work/bin/gpucheck" --coordinator "$work/bin/coordinator" --model "$model" --llama-lib "$lib" \
  --out "$out" --deadline "$deadline" "${check[@]}" "${metaflags[@]}" || rc=$?
log "done in $(($(date +%s) - start)) s; results in $out (gpucheck.json, profile.json, build.json, logs)"
exit $rc
