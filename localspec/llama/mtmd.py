"""llama-cpp-python's libmtmd binding, loaded once per process on first use, with its log lines routed into ours and
its last error kept for our one-line messages; and the marker that stands for an image in a prompt.
"""

from __future__ import annotations

import ctypes
import functools
from types import ModuleType

from localspec.errors import LocalspecError

from .log import LlamaLog, init


class _MtmdLog(LlamaLog):
    """mtmd's log lines into the `llama.cpp` channel, its INFO lines (one per tensor loaded) as DEBUG; its own last
    errors, so a refused projector is explained by mtmd's words and not by an older llama.cpp line."""

    def _on_log(self, level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        super()._on_log(1 if level == 2 else level, text, user_data)  # ggml_log_level: 1 DEBUG, 2 INFO


@functools.cache
def native() -> tuple[ModuleType, _MtmdLog]:
    """llama-cpp-python's mtmd binding (libmtmd) and its log bridge, loaded once per process on first use."""
    init()
    try:
        from llama_cpp import mtmd_cpp
    except (ImportError, OSError) as e:  # a llama-cpp-python built without libmtmd
        raise LocalspecError(f"this llama-cpp-python has no libmtmd, so it cannot read images ({e})") from None
    bridge = _MtmdLog()
    mtmd_cpp.mtmd_log_set(bridge.callback, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(bridge.callback, ctypes.c_void_p(0))
    return mtmd_cpp, bridge


def media_marker() -> str:
    """The text that stands for one image (or audio clip) in a prompt given to `Projector.tokenize`: `<__media__>`."""
    return native()[0].mtmd_default_marker().decode()


def mtmd_error() -> str:
    """mtmd's first error since the last call (then forgotten), its first line, without the functions it passed
    through ("mismatch between text model (n_embd = 64) and mmproj (n_embd = 48)", then a hint on a line of its own)."""
    bridge = native()[1]
    detail = bridge.last_error()
    bridge.recent_errors.clear()
    return detail.strip().splitlines()[0] if detail.strip() else ""
