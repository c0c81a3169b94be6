#!/usr/bin/env bash
# Rebuild llama-cpp-python for a GPU backend inside the current Python environment.
#   packaging/reinstall-llama-backend.sh cuda|metal|vulkan|cpu [PYTHON]
# llama-cpp-python is built from source; CMAKE_ARGS picks the ggml backend. `localspec doctor` then
# lists the devices the new build really has.
set -euo pipefail
backend=${1:-}
python=${2:-python3}
case "$backend" in
  cuda)   args="-DGGML_CUDA=on" ;;
  metal)  args="-DGGML_METAL=on" ;;
  vulkan) args="-DGGML_VULKAN=on" ;;
  cpu)    args="-DGGML_METAL=off -DGGML_CUDA=off" ;;
  *) echo "usage: $0 cuda|metal|vulkan|cpu [PYTHON]" >&2; exit 2 ;;
esac
version=$("$python" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null || echo "")
spec="llama-cpp-python${version:+==$version}"
echo "rebuilding $spec with CMAKE_ARGS=\"$args\" (this compiles llama.cpp: several minutes)"
CMAKE_ARGS="$args" "$python" -m pip install --force-reinstall --no-deps --no-cache-dir "$spec"
"$python" -m localspec doctor
