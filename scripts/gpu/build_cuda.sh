#!/bin/bash
# Build libllama + libggml (CUDA, sm_90 only) and llama-server from the pruned llama-cpp-python 0.3.36 source, offline.
# Run from the directory that holds src.tar.gz (default: this script's directory):
#   bash build_cuda.sh            # configure + build, pack libs into $OUT (or ./out): a folder for results
# Env: JOBS (default nproc), ARCH (default 90-real), FA_QUANTS (default f16-f16), W (work dir, default /tmp/w),
#      SEARCH (dirs searched for cuBLAS / libcuda; default covers /usr/local/cuda*, driver dirs, /opt venvs),
#      EXTRAS (default 1: also build llama-server, llama-bench, llama-speculative-simple, llama-quantize; needs llama-common,
#      ~+200 CPU-s; set EXTRAS=0 for libllama/libggml only)
set -eo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${W:-/tmp/w}; OUTD=${OUT:-$HERE/out}; mkdir -p "$W" "$OUTD"
JOBS=${JOBS:-$(nproc)}; ARCH=${ARCH:-90-real}; FA_QUANTS=${FA_QUANTS:-f16-f16}; EXTRAS=${EXTRAS:-1}
if [ "$EXTRAS" = 1 ]; then ON=ON; else ON=OFF; fi
SEARCH=${SEARCH:-"/usr/local/cuda /usr/local/cuda-13.0 /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/lib64 /opt"}
t0=$(date +%s); log() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

if [ ! -d "$W/src/llama_cpp_python-0.3.36" ]; then
  mkdir -p "$W/src" && tar xzf "$HERE/src.tar.gz" -C "$W/src"; fi
S=$W/src/llama_cpp_python-0.3.36
NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
NVCC=$(readlink -f "$NVCC")
log "nvcc=$NVCC; $($NVCC --version | tail -1); cmake $(cmake --version | head -1 | cut -d' ' -f3); ninja $(ninja --version); nproc $(nproc)"

# cuBLAS headers/libs and the driver library may live outside the toolkit (pip wheels, driver mount):
# collect them into one dir with unversioned names so FindCUDAToolkit sees CUDA::cublas and CUDA::cuda_driver.
X=$W/cudaextra; mkdir -p "$X/include" "$X/lib"
pick() { find $SEARCH -name "$1" \( -type f -o -type l \) 2>/dev/null | grep -v -e /stubs/ -e '/proc/' | head -1 || true; }
H=$(pick cublas_v2.h)
if [ -n "$H" ]; then for f in "$(dirname "$H")"/cublas*.h; do ln -sf "$f" "$X/include/"; done; fi
for lib in cublas cublasLt; do
  f=$(pick "lib$lib.so"); [ -z "$f" ] && f=$(pick "lib$lib.so.1[0-9]*")
  if [ -n "$f" ]; then ln -sf "$(readlink -f "$f")" "$X/lib/lib$lib.so"; fi; done
f=$(find $SEARCH -name 'libcuda.so*' 2>/dev/null | grep -v -e '/proc/' | head -1 || true)   # stub or real driver lib
if [ -n "$f" ] && [ ! -e "$(dirname "$NVCC")/../lib64/stubs/libcuda.so" ]; then ln -sf "$(readlink -f "$f")" "$X/lib/libcuda.so"; fi
log "cublas_v2.h: ${H:-MISSING}; extra libs: $(ls "$X/lib" | tr '\n' ' ')"

B=$W/build
if [ ! -f "$B/build.ninja" ]; then
cmake -S "$S/vendor/llama.cpp" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DGGML_CUDA_FA_QUANTS="$FA_QUANTS" -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=$ON -DLLAMA_BUILD_TOOLS=$ON -DLLAMA_BUILD_SERVER=$ON \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_COMMON=$ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
  "-DCMAKE_LIBRARY_PATH=$X/lib" "-DCMAKE_CUDA_FLAGS=-I$X/include" $EXTRA_CMAKE > "$W/configure.log" 2>&1 \
  || { tail -40 "$W/configure.log"; exit 1; }
grep -E "CUDA Toolkit|CUDA_ARCH|FlashAttention|Including" "$W/configure.log" || true
fi
if [ -n "$CONFIGURE_ONLY" ]; then log "configured (CONFIGURE_ONLY)"; exit 0; fi
log "configured; building llama with -j$JOBS"
ninja -C "$B" -j"$JOBS" llama > "$W/build.log" 2>&1 || { grep -E -B2 -A20 "error|FAILED" "$W/build.log" | head -60; exit 1; }
tail -1 "$W/build.log"; log "built libllama + libggml-cuda"
if [ "$EXTRAS" = 1 ]; then
  ninja -C "$B" -j"$JOBS" llama-server llama-bench llama-speculative-simple llama-quantize >> "$W/build.log" 2>&1 \
    && log "built extras" || { grep -E -A10 "error|FAILED" "$W/build.log" | head -30; log "extras FAILED (libs still usable)"; }
fi

# pack: soname-named plain files, loadable from any dir with LD_LIBRARY_PATH=<dir> (RUNPATH is $ORIGIN too)
L=$W/libs; rm -rf "$L"; mkdir -p "$L"
cp -L "$B/bin/libllama.so" "$L/"; ln -s libllama.so "$L/libllama.so.0"   # python opens libllama.so, tools need .so.0
for f in "$B"/bin/libggml*.so.0 "$B"/bin/libllama-common.so.0 "$B"/bin/libllama-quantize-impl.so \
         "$B"/bin/libllama-bench-impl.so "$B"/bin/libllama-server-impl.so "$B"/bin/libmtmd.so* "$B"/bin/llama-server "$B"/bin/llama-bench "$B"/bin/llama-speculative-simple \
         "$B"/bin/llama-quantize; do
  if [ -e "$f" ]; then cp -L "$f" "$L/"; fi; done
ls -la "$L"
# result folders may cap files at 16 MiB: ship the ~23 MB tarball as 15 MiB parts (cat them back together)
tar -C "$W" -czf "$W/libs-cuda.tar.gz" libs
split -b 15M -d "$W/libs-cuda.tar.gz" "$OUTD/libs-cuda.tar.gz.part"
ls -la "$W/libs-cuda.tar.gz" "$OUTD"/libs-cuda.tar.gz.part*
cp "$W/configure.log" "$W/build.log" "$OUTD/" 2>/dev/null || true
awk 'NR>1{t=($2-$1)/1000; s+=t} NR>1 && $4 ~ /\.cu\.o$/ {c+=($2-$1)/1000; n++} END {printf "ninja: %d CUDA objects, %.0f job-s in nvcc, %.0f job-s total (sum of per-file wall times)\n", n, c, s}' "$B/.ninja_log"
log "done"
