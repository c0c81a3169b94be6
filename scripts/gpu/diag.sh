#!/bin/bash
# interleaved: device sampling on/off on the GPU
set -o pipefail
HERE=scripts/gpu; source $HERE/cuda_env.sh; export PYTHONPATH=$PWD:$PYTHONPATH; M=/tmp/models; mkdir -p $M
[ -f "$M/target-8b.gguf" ] || python3 "$HERE/make_model.py" "$M/target-8b.gguf" --preset llama31-8b --mode echo >/dev/null
[ -f "$M/draft-1b.gguf" ] || python3 "$HERE/make_model.py" "$M/draft-1b.gguf" --preset llama32-1b --mode echo --agree 0.8 >/dev/null
for r in 1 2; do for ds in on off; do
python3 -m localspec bench --target $M/target-8b.gguf --draft $M/draft-1b.gguf --n-gpu-layers 99 --k 4 --temperature 0,0.8 --tokens 128 --rounds 2 --device-sampling $ds --json > $OUT/ds-$ds-$r.json 2>/dev/null; echo "$ds $r rc $?"
python3 -c 'import sys; from localspec.bench.report import from_json, render; print("\n".join(render(from_json(sys.stdin.read()))))' < $OUT/ds-$ds-$r.json | sed -n 7,16p
done; done
