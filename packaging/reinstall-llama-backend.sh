#!/usr/bin/env bash
# Build llama-cpp-python (llama.cpp from source) with the ggml backends you name, and install it.
#   packaging/reinstall-llama-backend.sh [rpc] [cuda|metal|vulkan|cpu] [amx] [--python PY]
# Backends combine: `rpc cuda` builds the RPC client/worker and CUDA. With no backend named: `rpc` (CPU + RPC),
# the build that `packaging/setup.sh` installs.
#
# llama.cpp is compiled for this CPU (-march=native) but never with its AMX kernels: the pinned source built by
# GCC 12 loads an empty AMX tile configuration (GCC's _tile_loadconfig declares an 8-byte read, so the stores that
# fill the configuration are dropped as dead), and every quantized model then crashes in its first batched decode
# on Intel CPUs with AMX. `amx` builds them anyway, from the sdist with packaging/patches/ggml-amx-tile-config.patch
# (the configuration as a constant), for measuring them on such a CPU (docs/install.md "Every x86 CPU").
#
# pip's wheel cache keys a source build on the download URL, not on CMAKE_ARGS or the CPU, so a cached wheel would
# be reused silently for another backend set or on another processor. This script therefore builds with pip's
# cache off into a wheelhouse of its own, keyed on the version, the backend set and what -march=native means to
# this compiler on this CPU (~/.cache/localspec/wheels/0.3.36-rpc-x86_64-1a2b3c4d5e6f/…): the first build of a key
# compiles llama.cpp (minutes), every later install with the same key takes the wheel from there. Afterwards it
# checks that the installed library really has what was asked for.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=python3
backends=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python=$2; shift 2 ;;
    rpc|cuda|metal|vulkan|cpu|amx) backends+=("$1"); shift ;;
    *) echo "usage: $0 [rpc] [cuda|metal|vulkan|cpu] [amx] [--python PY]" >&2; exit 2 ;;
  esac
done
[ ${#backends[@]} -eq 0 ] && backends=(rpc)

args=""
amx=no
for b in "${backends[@]}"; do
  case "$b" in
    rpc)    args="$args -DGGML_RPC=on" ;;
    cuda)   args="$args -DGGML_CUDA=on" ;;
    metal)  args="$args -DGGML_METAL=on" ;;
    vulkan) args="$args -DGGML_VULKAN=on" ;;
    cpu)    args="$args -DGGML_METAL=off -DGGML_CUDA=off" ;;
    amx)    amx=yes ;;
  esac
done
args=${args# }

# The C and C++ flags every compile gets: on x86-64 no AMX unless asked for (explicit -mno-* flags win over the
# -march=native that ggml adds, in GCC and Clang alike).
cflags=${CFLAGS:-}
machine=$(uname -m)
case "$machine" in
  x86_64|amd64|AMD64) [ "$amx" = yes ] || cflags="$cflags -mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;;
esac
cflags=${cflags# }

# What the build depends on besides the backends: the compiler and the instruction sets -march=native turns on.
cxx=${CXX:-c++}
target=$( { "$cxx" --version 2>/dev/null | head -n 1; echo | "$cxx" $cflags -march=native -dM -E -x c++ - 2>/dev/null \
  | sort; } | "$python" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:12])')
key="$(printf '%s\n' "${backends[@]}" | sort -u | paste -sd- -)-$machine-$target"

# The one version localspec is tested with (its RPC calls are bound with ctypes): pyproject.toml owns it.
version=$(sed -n 's/^ *"llama-cpp-python==\([^"]*\)".*/\1/p' "$here/../pyproject.toml")
[ -n "$version" ] || { echo "pyproject.toml does not pin llama-cpp-python==VERSION" >&2; exit 2; }

wheels="${LOCALSPEC_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/localspec/wheels}/$version-$key"
wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-cpp-python $version with CMAKE_ARGS=\"$args\" CFLAGS=\"$cflags\" (compiles llama.cpp: several minutes)"
  rm -rf "$wheels.part" && mkdir -p "$wheels.part"
  source="llama-cpp-python==$version"
  if [ "$amx" = yes ]; then  # the sdist, patched
    "$python" -m pip download --quiet --no-deps --no-binary llama-cpp-python --no-cache-dir -d "$wheels.part/src" "$source"
    tar -xzf "$wheels.part/src/llama_cpp_python-$version.tar.gz" -C "$wheels.part/src"
    source="$wheels.part/src/llama_cpp_python-$version"
    patch --quiet -p1 -d "$source/vendor/llama.cpp" < "$here/patches/ggml-amx-tile-config.patch"
  fi
  CMAKE_ARGS="$args" CFLAGS="$cflags" CXXFLAGS="${CXXFLAGS:-} $cflags" "$python" -m pip wheel --no-deps \
    --no-cache-dir --no-binary llama-cpp-python -w "$wheels.part" "$source"
  rm -rf "$wheels.part/src" "$wheels" && mv "$wheels.part" "$wheels"
  wheel=$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -n 1)
else
  echo "llama-cpp-python $version ($key) from $wheels"
fi
"$python" -m pip install --force-reinstall --no-deps --quiet "$wheel"
"$python" -m pip install --quiet "$wheel"  # its own dependencies, where missing

# Check the result against what was asked, with the library itself (not the wheel's name).
case " ${backends[*]} " in
  *" rpc "*)
    "$python" - <<'PY'
import ctypes, importlib.util, pathlib, sys
lib = pathlib.Path(importlib.util.find_spec("llama_cpp").submodule_search_locations[0]) / "lib"
found = [p for p in lib.glob("*ggml*") if hasattr(ctypes.CDLL(str(p)), "ggml_backend_rpc_add_server")]
if not found:
    sys.exit(f"the installed llama.cpp in {lib} has no RPC backend: remove the wheelhouse and run this script again")
PY
    ;;
esac
echo "llama-cpp-python $version installed with: ${backends[*]}"
