"""The chat's one engine thread: which worker may use the engine, the one thread it runs on, swapping it for another,
and freeing it at exit.

Loading, pulling and generating run in thread workers; only one of them may touch the engine at a time, and the
app must not free the models while one still runs a step. `EngineThread` owns that lock, the "closing" flag that
a late load checks, and the interpreter's GIL switch interval while the chat runs. It never touches Textual.

Every load and generation runs on this one engine thread, whichever worker asks (`run`): llama.cpp's OpenMP
keeps a pool of worker threads for each thread that calls into it, and a second calling thread's pool fights the
first one's for the cores. Measured on 2 cores (demo pair, plain): one thread for everything 80–83 tok/s, a new
thread per answer 52–80, a second thread beside the loading one 41–47 (DESIGN §7, threads).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from localspec.core.engine import Engine

from .loading import Loaded

log = logging.getLogger(__name__)

# The worker makes many short llama.cpp calls, each releasing the GIL; with Python's default 5 ms switch interval
# it waits up to that long to get it back while the UI renders (the convoy effect).
GIL_SWITCH_INTERVAL = 0.001  # seconds
EXIT_WAIT = 30.0  # seconds to wait at exit for the worker that holds the engine
T = TypeVar("T")


class EngineThread:
    """The lock around the engine, held by whichever worker uses it; `open` and `close` bracket the chat."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.closing = False
        self._switch_interval = sys.getswitchinterval()
        self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-engine")

    def open(self) -> None:
        """The chat starts: switch threads often enough that the worker and the UI both stay quick."""
        sys.setswitchinterval(min(self._switch_interval, GIL_SWITCH_INTERVAL))

    def run(self, work: Callable[[], T]) -> T:
        """In a worker: hold the engine and run `work` (a generation, say) on the engine thread; its result.

        Raises:
            Exception: whatever `work` raises.
        """
        with self._lock:
            return self._engine_thread.submit(work).result()

    def replace(self, old: Engine | None, load: Callable[[], Loaded]) -> Loaded | None:
        """In a worker: free `old`, then `load()` another, on the engine thread; None when the chat closed meanwhile
        (it is freed).

        Raises:
            Exception: whatever `load` raises (the old engine is freed all the same).
        """

        def swap() -> Loaded | None:
            if old is not None:
                old.close()
            loaded = load()
            if self.closing:
                loaded.engine.close()
                return None
            return loaded

        return self.run(swap)

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
            self._engine_thread.shutdown(wait=False)
