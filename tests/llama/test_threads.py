"""Threads follow the cores other processes leave free: the monitor sees another process's busy loop and leaves this
process's own work out (checked against /proc read here, so a busy machine does not fail them), and the tuner moves
the contexts' thread count with it (the count never depends on this process's own load)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from localspec.llama import threads

pytestmark = pytest.mark.skipif(not threads.CoreMonitor.available(), reason="needs /proc/stat (Linux)")


TICK_SLACK = 0.05  # core-seconds: /proc counts in clock ticks (1/100 s), a few of which a reading may miss


def machine_busy() -> float:
    """Busy core-seconds of the whole machine since boot, read from /proc/stat here (apart from the monitor)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """A process's CPU seconds so far (user + system, /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (float(fields[11]) + float(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 600  # a hung wait fails; a slow one does not
    while not predicate():
        assert time.monotonic() < deadline, f"waited for {what}"
        time.sleep(0.02)


# The two tests below hold however busy the machine is: each waits on CPU time given (not on wall time), and checks the
# monitor against bounds read apart from it, which a monitor that misses what it must count (or counts what it must
# not) breaks by a core-share the test measured itself.


@pytest.mark.slow
def test_the_monitor_leaves_this_process_out():
    """Whatever else runs, the monitor's "others" are at most the machine's busy time less this process's own."""
    monitor = threads.CoreMonitor()
    cores = threads.physical_cores()
    busy_before = machine_busy()
    monitor.free_cores()  # the window begins
    wall, own = time.monotonic(), time.process_time()
    while time.process_time() - own < 0.5:  # this process busy for half a CPU-second, however long that takes
        pass
    wall, own = time.monotonic() - wall, time.process_time() - own
    free = monitor.free_cores()
    others_at_most = machine_busy() - busy_before - own + TICK_SLACK
    assert free >= cores - min(cores, others_at_most / wall) - 0.05, (free, others_at_most, own, wall)


@pytest.mark.slow
def test_the_monitor_counts_another_process():
    """Whatever else runs, a busy child's CPU time is among the monitor's "others"."""
    loop = "import time\nend = time.time() + 600\nwhile time.time() < end: pass"
    busy = subprocess.Popen([sys.executable, "-c", loop])
    try:
        monitor = threads.CoreMonitor()
        cores = threads.physical_cores()
        wait_for(lambda: cpu_seconds(busy.pid) > 0.05, "the child to run")
        start = time.monotonic()
        monitor.free_cores()  # the window begins
        before = cpu_seconds(busy.pid)
        wait_for(lambda: cpu_seconds(busy.pid) - before >= 0.5, "the child to use half a CPU-second")
        child = cpu_seconds(busy.pid) - before - TICK_SLACK
        free = monitor.free_cores()
        wall = time.monotonic() - start
    finally:
        busy.kill()
        busy.wait()
    assert free <= cores - min(cores, child / wall) + 0.05, (free, child, wall)


class FakeContext:
    def __init__(self, n: int) -> None:
        self.n_threads = n

    def set_threads(self, n: int) -> None:
        self.n_threads = n


class FixedMonitor:
    def __init__(self, free: float) -> None:
        self.free = free

    def free_cores(self, *, wait: float = 0.0) -> float:
        return self.free


def test_tuner_moves_every_context_with_the_free_cores(monkeypatch):
    monkeypatch.setattr(threads, "physical_cores", lambda: 4)
    contexts = [FakeContext(4), FakeContext(4)]
    monitor = FixedMonitor(4.0)
    tuner = threads.ThreadTuner(contexts, interval=0.0, monitor=monitor)
    for free, want in ((4.0, 4), (2.9, 3), (1.2, 1), (0.1, 1), (3.8, 4)):
        monitor.free = free
        assert tuner.check() == want
        assert [c.n_threads for c in contexts] == [want, want]


def test_a_little_use_by_others_does_not_flip_the_threads_back_and_forth(monkeypatch):
    # A client using a third of a core: at one cut (a core 70 % free is a thread) the server's two threads flipped
    # to one and back every check. Now a thread goes past half a core of others' use and comes back below a fifth.
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    contexts = [FakeContext(2)]
    monitor = FixedMonitor(2.0)
    tuner = threads.ThreadTuner(contexts, interval=0.0, monitor=monitor)
    for free, want in ((1.7, 2), (1.6, 2), (1.7, 2), (1.4, 1), (1.7, 1), (1.6, 1), (1.85, 2), (1.55, 2)):
        monitor.free = free
        assert tuner.check() == want, (free, want)
        assert contexts[0].n_threads == want


class WindowMonitor:
    """Reports the cores others left free since its last call, from a timeline the test writes."""

    def __init__(self) -> None:
        self.busy_since_last = 0.0  # cores others used since the last call

    def free_cores(self, *, wait: float = 0.0) -> float:
        free, self.busy_since_last = 2.0 - self.busy_since_last, 0.0
        return free


def test_a_generation_measures_from_its_own_start_not_across_the_idle_time_before_it(monkeypatch):
    # A server between two requests: a client (or a `generate` beside it) used both cores while the engine idled;
    # the first check of the next request counted that, and the request began on one thread (the log, 2026-11-27).
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    contexts = [FakeContext(2)]
    monitor = WindowMonitor()
    tuner = threads.ThreadTuner(contexts, interval=0.0, monitor=monitor)
    monitor.busy_since_last = 2.0  # between the requests
    tuner.start()  # the next request begins: measure from here
    assert tuner.check() == 2 and contexts[0].n_threads == 2
    monitor.busy_since_last = 1.5  # during the request: another process really took a core
    assert tuner.check() == 1


def test_a_context_decoded_on_another_thread_says_so(tiny_models, caplog):
    # llama.cpp's OpenMP keeps a pool of threads per calling thread; a second thread's pool fights the first's for
    # the cores (DESIGN §7: `serve` decoding on its worker what its main thread loaded ran at 0.57× `generate`).
    import logging
    import threading

    from localspec.llama.context import Context
    from localspec.llama.model import Model

    with Model(tiny_models.target, n_gpu_layers=0) as model, Context(model, n_ctx=64) as ctx:
        with caplog.at_level(logging.WARNING, logger="localspec.llama.context"):
            ctx.decode([1, 5, 6], 0)
            ctx.decode([7], 3)  # the same thread: nothing to say
            assert not caplog.records
            other = threading.Thread(target=lambda: ctx.decode([8], 4))
            other.start()
            other.join()
        assert [r.getMessage() for r in caplog.records if "another thread" in r.getMessage()], caplog.text
