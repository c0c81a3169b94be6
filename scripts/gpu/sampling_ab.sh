#!/bin/bash
# Run ON the GPU machine from the repository root (after bench.sh, or with the built parts carried):
#   bash scripts/gpu/sampling_ab.sh     # writes $OUT/ds-{on,off}-{1,2}.json and prints each table
# Where sampling should run on a GPU: `localspec bench` with `--device-sampling on` and `off`, alternated twice
# (k 4, T 0 and 0.8) on the 8B/1B echo pair bench.sh writes (made here if missing). docs/benchmarks.md "On a GPU".
set -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); OUT=${OUT:-$HERE/out}; M=${MODELS:-/tmp/models}
mkdir -p "$M" "$OUT"
# shellcheck source=/dev/null
source "$HERE/cuda_env.sh"
export PYTHONPATH=$ROOT:$PYTHONPATH
[ -f "$M/target-8b.gguf" ] || python3 "$HERE/make_model.py" "$M/target-8b.gguf" --preset llama31-8b --mode echo >/dev/null
[ -f "$M/draft-1b.gguf" ] || python3 "$HERE/make_model.py" "$M/draft-1b.gguf" --preset llama32-1b --mode echo \
  --agree "${AGREE:-0.8}" >/dev/null
for r in 1 2; do for ds in on off; do
  python3 -m localspec bench --target "$M/target-8b.gguf" --draft "$M/draft-1b.gguf" --n-gpu-layers 99 --k 4 \
    --temperature 0,0.8 --tokens 128 --rounds 2 --device-sampling $ds --json > "$OUT/ds-$ds-$r.json" 2>/dev/null
  echo "device sampling $ds, run $r: rc $?"
  python3 -c 'import sys; from localspec.bench.report import from_json, render; print("\n".join(render(from_json(sys.stdin.read()))))' \
    < "$OUT/ds-$ds-$r.json" | sed -n 7,16p
done; done
