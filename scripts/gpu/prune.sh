#!/bin/bash
# Usage: prune.sh <extracted llama_cpp_python-0.3.36 dir> <out dir>
# Produces <out>/llama_cpp_python-0.3.36 : the python package + top-level build files
# + a vendored llama.cpp reduced to what libllama/libggml(+CUDA)/llama-common/llama-quantize need.
set -euo pipefail
SRC=$(realpath "$1"); OUT=$(realpath -m "$2")
P=$OUT/llama_cpp_python-0.3.36
rm -rf "$P"; mkdir -p "$P/vendor/llama.cpp"
# python package side (no docs/examples/tests/docker)
cp -a "$SRC"/{CMakeLists.txt,pyproject.toml,LICENSE.md,README.md,PKG-INFO} "$P"/
cp -a "$SRC/llama_cpp" "$P"/
V=$SRC/vendor/llama.cpp; D=$P/vendor/llama.cpp
cp -a "$V"/{CMakeLists.txt,LICENSE,cmake,include,src,common,vendor,licenses} "$D"/
# ggml: keep build files, headers, core sources, CPU + CUDA backends only
mkdir -p "$D/ggml/src"
cp -a "$V/ggml"/{CMakeLists.txt,cmake,include} "$D/ggml"/
find "$V/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$D/ggml/src"/ \;
cp -a "$V/ggml/src"/{ggml-cpu,ggml-cuda} "$D/ggml/src"/
# tools/examples (need LLAMA_BUILD_COMMON=ON; all optional): llama-quantize (F16 -> Q4_K_M), llama-bench (raw
# pp/tg numbers), llama-speculative(-simple) (C++ speculative loop).
# llama-server (the peer of `localspec bench --peer`) is kept too, with tools/mtmd, which it links.
mkdir -p "$D/tools" "$D/examples" "$D/pocs"
cp -a "$V/tools/quantize" "$V/tools/llama-bench" "$V/tools/server" "$V/tools/mtmd" "$D/tools"/
# llama-server links llama-ui: keep only its build files (no npm sources); with LLAMA_BUILD_UI=OFF and
# LLAMA_USE_PREBUILT_UI=OFF scripts/ui-assets.cmake embeds an empty asset table (no web UI, no download).
mkdir -p "$D/tools/ui" "$D/scripts"
cp -a "$V/tools/ui"/{CMakeLists.txt,ui.cpp.in,ui.h.in,sources.cmake} "$D/tools/ui"/
cp -a "$V/scripts/ui-assets.cmake" "$D/scripts"/
printf 'add_subdirectory(quantize)\nadd_subdirectory(llama-bench)\nadd_subdirectory(mtmd)\nadd_subdirectory(ui)\nadd_subdirectory(server)\n' \
  > "$D/tools/CMakeLists.txt"
cp -a "$V/examples/speculative" "$V/examples/speculative-simple" "$D/examples"/
printf 'add_subdirectory(speculative)\nadd_subdirectory(speculative-simple)\n' > "$D/examples/CMakeLists.txt"
: > "$D/pocs/CMakeLists.txt"
mkdir -p "$D/app" "$D/tests"; : > "$D/app/CMakeLists.txt"; : > "$D/tests/CMakeLists.txt"   # defaults (APP/TESTS ON) still configure
# gguf-py: pure-python gguf writer matching this llama.cpp version (no tests/examples)
mkdir -p "$D/gguf-py"; cp -a "$V/gguf-py"/{gguf,pyproject.toml,LICENSE,README.md} "$D/gguf-py"/
# drop bulky non-build files inside kept dirs
echo "pruned tree at $P"
