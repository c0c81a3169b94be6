#!/bin/bash
# Run ON the GPU machine from the repository root (after prepare.sh here, and build_cuda.sh there):
#   bash scripts/gpu/bench.sh          # writes $OUT/bench-gpu.txt and $OUT/bench-gpu.json
# Makes an 8B-shape target and a 1B-shape draft in Q4_K_M layout ("echo" models: every layer runs its full
# matmuls, and the two agree on AGREE of the tokens, so acceptance is known in advance), then runs
# `localspec bench` with llama-server from the same llama.cpp source as the peer, all layers on the GPU.
# Env: AGREE (default 0.8), TOKENS (default 128), ROUNDS (default 2), MODELS (default /tmp/models).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
AGREE=${AGREE:-0.8}; TOKENS=${TOKENS:-128}; ROUNDS=${ROUNDS:-2}; MODELS=${MODELS:-/tmp/models}; OUT=${OUT:-$HERE/out}
mkdir -p "$MODELS" "$OUT"
# shellcheck source=/dev/null
source "$HERE/cuda_env.sh"
export PYTHONPATH=$ROOT:$PYTHONPATH
[ -f "$MODELS/target-8b.gguf" ] || python3 "$HERE/make_model.py" "$MODELS/target-8b.gguf" --preset llama31-8b --mode echo
[ -f "$MODELS/draft-1b.gguf" ] || python3 "$HERE/make_model.py" "$MODELS/draft-1b.gguf" --preset llama32-1b --mode echo \
  --agree "$AGREE"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m localspec bench --target "$MODELS/target-8b.gguf" --draft "$MODELS/draft-1b.gguf" --n-gpu-layers 99 \
  --k 4,8 --temperature 0,0.8 --tokens "$TOKENS" --rounds "$ROUNDS" --peer "$W/libs/llama-server" --json \
  > "$OUT/bench-gpu.json"
python3 -c 'import sys; from localspec.bench.report import from_json, render; print("\n".join(render(from_json(sys.stdin.read()))))' \
  < "$OUT/bench-gpu.json" | tee "$OUT/bench-gpu.txt"
