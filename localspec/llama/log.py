"""llama.cpp's log lines routed to `logging`, and the last error it logged, for our own one-line messages.

`init()` is the one entry to llama.cpp for every loader: it starts the backend and installs the log bridge,
once per process. llama.cpp's lines go to their own channel, `llama.cpp` (LOG_NAME), not to one of ours: the CLI
sends both to the log file, and a Python user can quiet one without the other.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
from collections import deque

import llama_cpp

LOG_NAME = "llama.cpp"
llama_log = logging.getLogger(LOG_NAME)
# "llama_model_load: error loading model: check_tensor_dims: " before the cause: the functions an error passed through
_CALLERS = re.compile(r"^(?:(?:[A-Za-z_][\w:]*|error loading model): )+")
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}  # ggml_log_level; 5 = CONT


class LlamaLog:
    """Forwards llama.cpp's log lines to `logging` and keeps the last errors for our messages."""

    def __init__(self) -> None:
        self.recent_errors: deque[str] = deque(maxlen=4)
        self._pending = ""
        self._level = logging.DEBUG
        # Keep the ctypes callback alive as long as llama.cpp may call it.
        self.callback = llama_cpp.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        if level in _LEVELS:
            self._level = _LEVELS[level]  # CONT lines continue the previous level
        self._pending += text.decode("utf-8", errors="replace")
        if not self._pending.endswith("\n"):
            return  # llama.cpp prints progress dots without newlines
        line, self._pending = self._pending.rstrip(), ""
        py_level = self._level
        if py_level >= logging.ERROR and line:
            self.recent_errors.append(line)
        llama_log.log(py_level, "%s", line)

    def last_error(self) -> str:
        """The most specific of the errors logged since they were last cleared: the first, which names the cause
        ("tensor 'blk.2.attn_norm.weight' not found"; the lines after it say what failed because of it), without
        the names of the functions it passed through."""
        if not self.recent_errors:
            return ""
        return _CALLERS.sub("", self.recent_errors[0]) or self.recent_errors[0]


@functools.cache
def init() -> LlamaLog:
    """Initialise llama.cpp once per process and route its logs; called by every loader.

    llama.cpp has one log callback and one backend per process, so the bridge is the process's too: the cache
    makes this idempotent and keeps the ctypes callback alive for as long as llama.cpp may call it.
    """
    # An abort prints its one-line message; ggml would follow it with ~60 lines of a debugger's backtrace over the
    # user's terminal. faulthandler (armed by the CLI) writes the Python side of it into the log instead.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    bridge = LlamaLog()
    llama_cpp.llama_log_set(bridge.callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    return bridge


def llama_error() -> str:
    """The last error llama.cpp logged (then forgotten), as a suffix for our own message; "" when none."""
    bridge = init()
    detail = bridge.last_error()
    bridge.recent_errors.clear()
    return f" (llama.cpp: {detail})" if detail else ""
