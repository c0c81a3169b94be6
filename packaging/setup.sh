#!/usr/bin/env bash
# Set up ./.venv: llama-cpp-python built with the RPC backend (so `localspec worker` and `--rpc` work), then
# localspec itself with the extra you name, then the canary: a tiny model of each quantization type decoded in a
# child process, so a build that crashes on this CPU is one line here and not a crash in the first chat.
#   packaging/setup.sh demo    # the chat on the offline demo pair
#   packaging/setup.sh test    # the test suite's dependencies
# Extra backends for llama.cpp (cuda, metal, vulkan; amx to try llama.cpp's AMX kernels, patched) go in
# LOCALSPEC_BACKENDS, e.g. LOCALSPEC_BACKENDS=cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-demo}
[ -x .venv/bin/python ] || python3 -m venv .venv
# shellcheck disable=SC2086  # LOCALSPEC_BACKENDS is a list of words
packaging/reinstall-llama-backend.sh rpc ${LOCALSPEC_BACKENDS:-} --python .venv/bin/python
.venv/bin/pip install --quiet -e ".[$extra]"
.venv/bin/python -m localspec.llama.canary
