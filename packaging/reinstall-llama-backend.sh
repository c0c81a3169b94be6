#!/usr/bin/env bash
# Build llama-cpp-python (llama.cpp from source) with the ggml backends you name, and install it.
#   packaging/reinstall-llama-backend.sh [rpc] [cuda|metal|vulkan|cpu] [--python PY]
# Backends combine: `rpc cuda` builds the RPC client/worker and CUDA. With no backend named: `rpc` (CPU + RPC),
# the build that `packaging/setup.sh` installs.
#
# pip's wheel cache keys a source build on the download URL, not on CMAKE_ARGS, so a cached CPU-only wheel would
# be reused silently for a CUDA or RPC build. This script therefore builds with pip's cache off into a wheelhouse
# of its own, keyed on the version and the backend set (~/.cache/localspec/wheels/0.3.36-rpc/…): the first build
# of a set compiles llama.cpp (minutes), every later install of the same set takes the wheel from there.
# Afterwards it checks that the installed library really has what was asked for.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=python3
backends=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python=$2; shift 2 ;;
    rpc|cuda|metal|vulkan|cpu) backends+=("$1"); shift ;;
    *) echo "usage: $0 [rpc] [cuda|metal|vulkan|cpu] [--python PY]" >&2; exit 2 ;;
  esac
done
[ ${#backends[@]} -eq 0 ] && backends=(rpc)

args=""
for b in "${backends[@]}"; do
  case "$b" in
    rpc)    args="$args -DGGML_RPC=on" ;;
    cuda)   args="$args -DGGML_CUDA=on" ;;
    metal)  args="$args -DGGML_METAL=on" ;;
    vulkan) args="$args -DGGML_VULKAN=on" ;;
    cpu)    args="$args -DGGML_METAL=off -DGGML_CUDA=off" ;;
  esac
done
args=${args# }
key=$(printf '%s\n' "${backends[@]}" | sort -u | paste -sd- -)

# The one version localspec is tested with (its RPC calls are bound with ctypes): pyproject.toml owns it.
version=$(sed -n 's/^ *"llama-cpp-python==\([^"]*\)".*/\1/p' "$here/../pyproject.toml")
[ -n "$version" ] || { echo "pyproject.toml does not pin llama-cpp-python==VERSION" >&2; exit 2; }

wheels="${LOCALSPEC_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/localspec/wheels}/$version-$key"
wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-cpp-python $version with CMAKE_ARGS=\"$args\" (compiles llama.cpp: several minutes)"
  mkdir -p "$wheels.part"
  CMAKE_ARGS="$args" "$python" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
    -w "$wheels.part" "llama-cpp-python==$version"
  rm -rf "$wheels" && mv "$wheels.part" "$wheels"
  wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -n 1)
else
  echo "llama-cpp-python $version ($key) from $wheels"
fi
"$python" -m pip install --force-reinstall --no-deps --quiet "$wheel"
"$python" -m pip install --quiet "$wheel"  # its own dependencies, where missing

# Check the result against what was asked, with the library itself (not the wheel's name).
case " ${backends[*]} " in
  *" rpc "*)
    "$python" - <<'EOF'
import ctypes, importlib.util, pathlib, sys
lib = pathlib.Path(importlib.util.find_spec("llama_cpp").submodule_search_locations[0]) / "lib"
found = [p for p in lib.glob("*ggml*") if hasattr(ctypes.CDLL(str(p)), "ggml_backend_rpc_add_server")]
if not found:
    sys.exit(f"the installed llama.cpp in {lib} has no RPC backend: remove the wheelhouse and run this script again")
EOF
    ;;
esac
echo "llama-cpp-python $version installed with: ${backends[*]}"
