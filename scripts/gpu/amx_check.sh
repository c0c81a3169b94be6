#!/bin/bash
# Issue 30's checks on a lent device machine's host CPU, when it is an Intel CPU with AMX (this machine is not).
# One device call, from the repository root, carrying scripts/gpu/src.tar.gz and scripts/gpu/whl (prepare.sh):
#   bash scripts/gpu/amx_check.sh          # exits at once, saying so, when the CPU has no AMX (FORCE=1 runs anyway)
# Builds llama.cpp for this CPU (-march=native, CPU only) from the pinned source three ways, in parallel:
#   shipped   as packaging/setup.sh builds it: without the AMX kernels (-mno-amx-*)
#   upstream  as the source builds by default: with them (the crash the issue reports, under GCC 12)
#   patched   with them and packaging/patches/ggml-amx-tile-config.patch (the opt-in `amx` build)
# then, for each: the canary (every quant type decoded in a child process), and `localspec bench --peer` (the same
# build's llama-server) on an echo pair in the Q4_K_M layout: plain and k = 4, T 0 — the upstream build with the
# repack off on both sides (the crash avoided by hand: the issue's "before"), the others with it on.
# Writes $OUT/amx.log and $OUT/bench-<variant>.json. Env: LIMIT (seconds, default 560), VARIANTS (default all
# three), TOKENS (48), JOBS (nproc).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-$HERE/out}; mkdir -p "$OUT"; exec > >(tee "$OUT/amx.log") 2>&1
LIMIT=${LIMIT:-560}; VARIANTS=${VARIANTS:-shipped upstream patched}; TOKENS=${TOKENS:-48}; JOBS=${JOBS:-$(nproc)}
W=${W:-/tmp/w}; MODELS=${MODELS:-/tmp/models}; PY=${PY:-python3}
t0=$(date +%s); left() { echo $(( LIMIT - ($(date +%s) - t0) )); }; log() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

lscpu | grep -E '^(Model name|CPU\(s\)|Thread)' ; gcc --version | head -1
AMX=$(grep -o -w -E 'amx_[a-z0-9]+' /proc/cpuinfo | sort -u | paste -sd' ')
echo "AMX flags: ${AMX:-none}"
if [ -z "$AMX" ] && [ -z "${FORCE:-}" ]; then echo "no AMX on this CPU: nothing to check here"; exit 0; fi

mkdir -p "$W/src" "$MODELS"
[ -d "$W/src/llama_cpp_python-0.3.36" ] || tar xzf "$HERE/src.tar.gz" -C "$W/src"
S=$W/src/llama_cpp_python-0.3.36
SITE=${SITE:-/tmp/site}
[ -d "$SITE/diskcache" ] || $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$HERE"/whl/*.whl
export PYTHONPATH=$ROOT:$S:$S/vendor/llama.cpp/gguf-py:$SITE PYTHONUNBUFFERED=1
# On the first AMX host (2026-11-27) every build died loading a model (llama_model::print_info) unless the system's
# libstdc++ was loaded first, as cuda_env.sh does for the CUDA build; NOPRELOAD=1 shows that crash again.
_STD=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
[ -z "${NOPRELOAD:-}" ] && [ -n "$_STD" ] && export LD_PRELOAD=$_STD${LD_PRELOAD:+:$LD_PRELOAD}
echo "LD_PRELOAD: ${LD_PRELOAD:-none}"

# The pair, written while llama.cpp builds: a 1B-shape echo target and a small echo draft agreeing on 0.8.
( [ -f "$MODELS/cpu-target.gguf" ] || $PY "$HERE/make_model.py" "$MODELS/cpu-target.gguf" --preset llama32-1b \
    --mode echo
  [ -f "$MODELS/cpu-draft.gguf" ] || $PY "$HERE/make_model.py" "$MODELS/cpu-draft.gguf" --n-embd 512 --n-layer 4 \
    --n-ff 1536 --n-head 8 --n-head-kv 8 --n-vocab 128256 --mode echo --agree 0.8 ) > "$W/cpu-models.log" 2>&1 &
MAKER=$!

build() {  # variant: configure and build libllama + llama-server for this CPU
  local v=$1 src=$S/vendor/llama.cpp flags=""
  case $v in
    shipped) flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;;
    patched) rm -rf "$W/llama-amx"; cp -r "$src" "$W/llama-amx"; src=$W/llama-amx
             patch -p1 -d "$src" < "$ROOT/packaging/patches/ggml-amx-tile-config.patch" || return 1 ;;
  esac
  cmake -S "$src" -B "$W/cpu-$v" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" > "$W/cpu-$v.configure.log" 2>&1 \
    && ninja -C "$W/cpu-$v" -j"$(( JOBS / $(wc -w <<< "$VARIANTS") ))" llama llama-server > "$W/cpu-$v.build.log" 2>&1
}
log "building: $VARIANTS"
PIDS=(); for v in $VARIANTS; do build "$v" & PIDS+=($!); done; wait "${PIDS[@]}"
BUILT=""
for v in $VARIANTS; do
  if [ -f "$W/cpu-$v/bin/libllama.so" ] && [ -x "$W/cpu-$v/bin/llama-server" ]; then BUILT="$BUILT $v"
  else echo "$v: build FAILED"; tail -20 "$W/cpu-$v.build.log" "$W/cpu-$v.configure.log" 2>/dev/null; fi
done
log "built:$BUILT"
on() {  # variant, command…: run with that build's llama.cpp
  local v=$1; shift
  LLAMA_CPP_LIB_PATH=$W/cpu-$v/bin LD_LIBRARY_PATH=$W/cpu-$v/bin "$@"
}
for v in $BUILT; do  # llama.cpp's system line says AMX_INT8 = 1 exactly when the AMX kernels are compiled in
  amx=$(on "$v" $PY -c 'from localspec.llama.devices import system_info; print(system_info())' | grep -c 'AMX_INT8 = 1')
  echo "$v: AMX kernels in the build: $([ "$amx" -gt 0 ] && echo yes || echo no)"
done
for v in $BUILT; do
  log "$v: canary"
  on "$v" timeout 300 $PY -m localspec.llama.canary; echo "$v: canary exit $?"
  on "$v" timeout 300 $PY -m localspec doctor 2>&1 | sed -n '/^CPU:/,/^Files:/p' | grep -v '^Files:'
done
wait $MAKER || { cat "$W/cpu-models.log"; exit 1; }
grep wrote "$W/cpu-models.log"; log "models written"
n=$(wc -w <<< "$BUILT")
for v in $BUILT; do
  repack=on; [ "$v" = upstream ] && repack=off
  secs=$(( $(left) / n - 5 )); n=$(( n - 1 ))
  log "$v: bench, repack $repack, ${secs}s"
  on "$v" env LOCALSPEC_REPACK=$repack timeout "$secs" $PY -m localspec bench --target "$MODELS/cpu-target.gguf" \
    --draft "$MODELS/cpu-draft.gguf" --k 4 --temperature 0 --verify pq \
    --tokens "$TOKENS" --rounds 1 --peer "$W/cpu-$v/bin/llama-server" --json > "$OUT/bench-$v.json"
  rc=$?; log "$v: bench exit $rc"
  [ $rc = 0 ] && $PY -c 'import sys; from localspec.bench.report import from_json, render; print("\n".join(render(from_json(sys.stdin.read()))))' < "$OUT/bench-$v.json"
done
log "done"
