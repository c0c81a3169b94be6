#!/bin/bash
# Run on a machine WITH network (here), before the GPU run: everything the GPU machine needs, since it has none.
#   scripts/gpu/prepare.sh            # -> scripts/gpu/src.tar.gz (pruned llama-cpp-python 0.3.36 + llama-server
#                                     #    source) and scripts/gpu/whl/ (localspec's runtime wheels)
# Env: PYVER (the GPU machine's Python, default 3.12; `python3 --version` there), PIP (default .venv/bin/pip).
# Both outputs are git-ignored and travel with the working tree to the device (they are under 64 MiB together).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
PYVER=${PYVER:-3.12}; PIP=${PIP:-$ROOT/.venv/bin/pip}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$PIP" download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$T" -q
tar xzf "$T"/llama_cpp_python-0.3.36.tar.gz -C "$T"
bash "$HERE/prune.sh" "$T/llama_cpp_python-0.3.36" "$T/pruned"
tar -C "$T/pruned" -czf "$HERE/src.tar.gz" llama_cpp_python-0.3.36
rm -rf "$HERE/whl"; mkdir -p "$HERE/whl"
# localspec's own dependencies (llama-cpp-python comes from the source above, built for CUDA there)
"$PIP" download -q -d "$HERE/whl" --only-binary :all: --python-version "$PYVER" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  numpy textual huggingface-hub platformdirs pydantic gguf diskcache typing-extensions jinja2
# the GPU image has numpy, and hf_xet only speeds up Hub downloads: leaving both out keeps the carried tree
# (these wheels, the source and the built libraries) under the device's 64 MiB
rm -f "$HERE"/whl/numpy-*.whl "$HERE"/whl/hf_xet-*.whl
ls -la "$HERE/src.tar.gz"; du -sh "$HERE/whl"
