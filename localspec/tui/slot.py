"""The chat's one engine slot: which worker may use the engine, swapping it for another, and freeing it at exit.

Loading, pulling and generating run in thread workers; only one of them may touch the engine at a time, and the
app must not free the models while one still runs a step. `EngineSlot` owns that lock, the "closing" flag that
a late load checks, and the interpreter's GIL switch interval while the chat runs. It never touches Textual.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from localspec.core.engine import Engine

from .loading import Loaded

log = logging.getLogger(__name__)

# The worker makes many short llama.cpp calls, each releasing the GIL; with Python's default 5 ms switch interval
# it waits up to that long to get it back while the UI renders (the convoy effect).
GIL_SWITCH_INTERVAL = 0.001  # seconds
EXIT_WAIT = 30.0  # seconds to wait at exit for the worker that holds the engine


class EngineSlot:
    """The lock around the engine, held by whichever worker uses it; `open` and `close` bracket the chat."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.closing = False
        self._switch_interval = sys.getswitchinterval()

    def open(self) -> None:
        """The chat starts: switch threads often enough that the worker and the UI both stay quick."""
        sys.setswitchinterval(min(self._switch_interval, GIL_SWITCH_INTERVAL))

    @contextmanager
    def using(self) -> Iterator[None]:
        """In a worker: hold the engine for the block (a generation, say)."""
        with self._lock:
            yield

    def replace(self, old: Engine | None, load: Callable[[], Loaded]) -> Loaded | None:
        """In a worker: free `old`, then `load()` another; None when the chat closed meanwhile (it is freed).

        Raises:
            Exception: whatever `load` raises (the old engine is freed all the same).
        """
        with self._lock:
            if old is not None:
                old.close()
            loaded = load()
            if self.closing:
                loaded.engine.close()
                return None
            return loaded

    async def close(self, stop: Callable[[], object], detach: Callable[[], Engine | None]) -> None:
        """The chat ends: `stop` the answer, wait for the worker holding the engine, free what `detach` hands over.

        A worker stuck past `EXIT_WAIT` keeps the engine (freeing it under a running step would crash): logged.
        """
        self.closing = True
        sys.setswitchinterval(self._switch_interval)
        stop()
        if not await asyncio.to_thread(self._lock.acquire, timeout=EXIT_WAIT):
            log.warning("a worker still holds the engine at exit: not freeing it")
            return
        try:
            engine = detach()
            if engine is not None:
                engine.close()
        finally:
            self._lock.release()
