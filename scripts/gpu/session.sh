#!/bin/bash
# One device call, for a session lent a GPU for a few minutes: build (unless the libs are carried), write the pair,
# and run the two benchmarks docs/benchmarks.md "On a GPU" reports, each under a time limit so that the call
# ends inside the device's per-command limit with whatever finished. Run ON the GPU machine from the repository
# root, carrying scripts/gpu/src.tar.gz and scripts/gpu/whl (prepare.sh):
#   bash scripts/gpu/session.sh
# 1. bandwidth-bound: a 14B-shape echo target and a 1B-shape echo draft, every layer on the GPU
# 2. laptop: the same pair planned for an 8 GB GPU (`--gpu-memory 8G`: the draft whole, as many target layers as
#    fit, the rest on the CPU); the peer gets the same layer counts
# Writes to $OUT: the libs' parts (carry them next time: scripts/gpu/libs-cuda.tar.gz.part*), session.log,
# bandwidth.json, laptop.json. Env: LIMIT (seconds for the whole script, default 560), TARGET (make_model preset,
# default qwen25-14b-shape), AGREE (0.8), TOKENS (64), ROUNDS (1), NOBUILD=1 with NOCUDA=1 for a dry run on a CPU.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-$HERE/out}; mkdir -p "$OUT"; exec > >(tee "$OUT/session.log") 2>&1
LIMIT=${LIMIT:-560}; TARGET=${TARGET:-qwen25-14b-shape}; AGREE=${AGREE:-0.8}; TOKENS=${TOKENS:-64}
ROUNDS=${ROUNDS:-1}; MODELS=${MODELS:-/tmp/models}; W=${W:-/tmp/w}; PY=${PY:-python3}
t0=$(date +%s); left() { echo $(( LIMIT - ($(date +%s) - t0) )); }; log() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
mkdir -p "$MODELS" "$W/src"
# the host CPU, for issue 30: with AMX flags, run scripts/gpu/amx_check.sh in the next call
lscpu | grep -E '^Model name'; echo "host AMX flags: $(grep -o -w -E 'amx_[a-z0-9]+' /proc/cpuinfo | sort -u | paste -sd' ')"
[ -d "$W/src/llama_cpp_python-0.3.36" ] || tar xzf "$HERE/src.tar.gz" -C "$W/src"
G=$W/src/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py
( export PYTHONPATH=$G${PYTHONPATH:+:$PYTHONPATH}
  [ -f "$MODELS/target.gguf" ] || $PY "$HERE/make_model.py" "$MODELS/target.gguf" --preset "$TARGET" --mode echo
  [ -f "$MODELS/draft.gguf" ] || $PY "$HERE/make_model.py" "$MODELS/draft.gguf" --preset llama32-1b --mode echo \
    --agree "$AGREE" ) > "$W/models.log" 2>&1 &
MAKER=$!
if [ -z "${NOBUILD:-}" ] && [ ! -f "$W/libs/libllama.so" ] && ! ls "$HERE"/libs-cuda.tar.gz.part* >/dev/null 2>&1; then
  log "building"
  OUT=$W/bout JOBS=$(nproc) bash "$HERE/build_cuda.sh" > "$W/build.txt" 2>&1 || { tail -30 "$W/build.txt"; exit 1; }
  grep -E '^\[[0-9]+s\]|ninja:' "$W/build.txt"; cp "$W"/bout/libs-cuda.tar.gz.part* "$OUT/"
fi
wait $MAKER || { cat "$W/models.log"; exit 1; }
grep wrote "$W/models.log"; log "models written"
if [ -z "${NOCUDA:-}" ]; then
  # shellcheck source=/dev/null
  source "$HERE/cuda_env.sh"; PEER=(--peer "$W/libs/llama-server")
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
else PEER=(); fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
render() { $PY -c 'import sys; from localspec.bench.report import from_json, render; print("\n".join(render(from_json(sys.stdin.read()))))' < "$1"; }
bench() {  # name, seconds, bench arguments…
  local name=$1 secs=$2; shift 2; log "$name: localspec bench $*"
  timeout "$secs" $PY -m localspec bench --target "$MODELS/target.gguf" --draft "$MODELS/draft.gguf" \
    --tokens "$TOKENS" --rounds "$ROUNDS" "${PEER[@]}" --json "$@" > "$OUT/$name.json"
  local rc=$?; log "$name: exit $rc"; [ $rc = 0 ] && render "$OUT/$name.json"
}
bench bandwidth $(( $(left) * 45 / 100 )) --n-gpu-layers 99 --k 4,8 --temperature 0,0.8 --verify pq,match
bench laptop $(( $(left) - 5 )) --gpu-memory 8G --k 4 --temperature 0,0.8 --verify pq
log "done"
