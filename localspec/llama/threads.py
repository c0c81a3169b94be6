"""How many CPU threads llama.cpp gets: the cores, the user's LOCALSPEC_THREADS, and the cores other processes
leave free while generating (`ThreadTuner`). No native calls but `Context.set_threads`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Protocol

from localspec.errors import InvalidParamsError

log = logging.getLogger(__name__)
THREADS_ENV = "LOCALSPEC_THREADS"


class Threaded(Protocol):
    """What `ThreadTuner` changes: a context's thread count (`context.Context`)."""

    n_threads: int

    def set_threads(self, n: int) -> None: ...


class FreeCores(Protocol):
    """What `ThreadTuner` asks of its monitor (`CoreMonitor`, or a fixed value in tests)."""

    def free_cores(self, *, wait: float = 0.0) -> float: ...


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(n: int, source: str = "--threads") -> int:
    """`n` when it is a usable thread count, else an InvalidParamsError naming the range."""
    top = cpu_count()
    if not 1 <= n <= top:
        raise InvalidParamsError(
            f"{source} {n} is out of range: this machine runs {top} thread"
            f"{'s' if top != 1 else ''} at once; use 1 to {top}"
        )
    return n


def threads_from_env(environ=None) -> int | None:
    """The thread count `LOCALSPEC_THREADS` asks for, None when unset.

    Raises:
        InvalidParamsError: set but not a whole number in range.
    """
    value = (os.environ if environ is None else environ).get(THREADS_ENV, "").strip()
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        shown = value.encode("utf-8", "replace").decode("utf-8")  # undecodable bytes arrive as surrogates
        raise InvalidParamsError(
            f"{THREADS_ENV}={shown!r} is not a whole number: unset it or use 1 to {cpu_count()}"
        ) from None
    return check_threads(n, f"{THREADS_ENV}=")


def physical_cores() -> int:
    """Physical core count (llama.cpp runs best with one thread per physical core)."""
    try:
        siblings = {
            Path(p, "topology/thread_siblings_list").read_text().strip()
            for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*")
            if Path(p, "topology/thread_siblings_list").exists()
        }
        if siblings:
            return len(siblings)
    except OSError:
        pass
    return os.cpu_count() or 1


def default_threads() -> tuple[int, str]:
    """Threads per context when none is asked for, and why (for `localspec doctor`)."""
    cores = physical_cores()
    if not CoreMonitor.available():
        return cores, f"one per physical core ({cores})"
    free = CoreMonitor().free_cores(wait=0.3)
    now = max(1, min(cores, int(free + 0.3)))
    return now, (
        f"one per core that other processes leave free, re-checked while generating (now {now} of "
        f"{cores}: others use {cores - free:.1f} cores); a spinning llama.cpp thread that shares its core "
        "with another process stalls every step"
    )


class CoreMonitor:
    """How many cores other processes leave free: the machine's busy time (/proc/stat) minus this process's.

    llama.cpp's CPU threads wait for each other at every operation by spinning; one thread that shares its
    core with another process makes all of them wait for the scheduler (measured on 2 cores: 0.33× plain
    speed with one busy-loop process; one thread instead keeps ~1×). So the thread count follows the cores
    actually free. Linux only; elsewhere `available()` is False and the count stays one per physical core.
    """

    def __init__(self) -> None:
        self._last = self._sample()

    @staticmethod
    def available() -> bool:
        return Path("/proc/stat").is_file()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        """(wall seconds, busy core-seconds of the whole machine, this process's CPU seconds)."""
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        ticks = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        return time.monotonic(), (sum(fields[:8]) - idle) / ticks, time.process_time()

    def free_cores(self, *, wait: float = 0.0) -> float:
        """Cores left free by other processes since the previous call (after sleeping `wait` seconds)."""
        if wait:
            time.sleep(wait)
        now = self._sample()
        wall = now[0] - self._last[0]
        others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2]))
        self._last = now
        cores = physical_cores()
        return cores - min(cores, others / wall) if wall > 0 else float(cores)


class ThreadTuner:
    """Keeps the contexts' thread count at the cores other processes leave free (see `CoreMonitor`).

    `check()` is cheap; it re-measures at most every `interval` seconds and changes the contexts' threads
    (`llama_set_n_threads`) when the free cores moved out of the band around the count in use (`wanted`).
    """

    def __init__(self, contexts: list[Threaded], *, interval: float = 0.5, monitor: FreeCores | None = None) -> None:
        """`monitor`: what measures the free cores (default: a `CoreMonitor` where /proc allows; none: fixed)."""
        self.contexts = contexts
        self.interval = interval
        self.cores = physical_cores()
        self.threads = contexts[0].n_threads if contexts else self.cores
        if monitor is None and CoreMonitor.available():
            monitor = CoreMonitor()
        self._monitor = monitor
        self._next = time.monotonic() + interval

    def start(self) -> None:
        """A generation begins: measure from now. The window since the last check may span the idle time between two
        generations, when another process (the client that sent the request, a `generate` beside a server) used the
        cores: counting that made the first step of every request drop to one thread (the server's log, 2026-11-27)."""
        if self._monitor is not None:
            self._monitor.free_cores()
            self._next = time.monotonic() + self.interval

    def check(self) -> int:
        """Re-measure when due; returns the thread count in use."""
        if self._monitor is None or time.monotonic() < self._next:
            return self.threads
        self._next = time.monotonic() + self.interval
        free = self._monitor.free_cores()
        wanted = self.wanted(free)
        if wanted != self.threads:
            log.info("threads %d -> %d (%.1f cores free)", self.threads, wanted, free)
            self.threads = wanted
            for ctx in self.contexts:
                ctx.set_threads(wanted)
        return self.threads

    def wanted(self, free: float) -> int:
        """The thread count for `free` cores, with a band between dropping and taking back a thread: a thread goes
        when others take more than half a core of the ones in use, and comes back when they leave 80 % of another
        core. At one cut (70 % free) a client that used a third of a core flipped 2 server threads to 1 and back
        every half second (the server's log, 2026-11-27), each switch a cold thread pool."""
        more, fewer = int(free + 0.2), int(free + 0.5)
        if more > self.threads:
            return min(self.cores, more)
        if fewer < self.threads:
            return max(1, fewer)
        return self.threads
