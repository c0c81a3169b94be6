"""Several requests generating at once on the one engine thread (`serve --parallel N`, DESIGN §8).

Up to N requests hold a slot each (core/slots.py: a sequence of the target's context); the rest wait in arrival
order, within the runner's bound. Each tick, on the engine thread: requests that fit join (continuous batching);
the next rows of every stream are decoded in ONE batch (`SlotPool.begin`), with drafts for some of them (their
n-gram copies, or the draft model's) where that is predicted to pay (core/batchdraft.py), and each stream takes one
step from it; a stream that runs alone is a tick of one stream, its step exactly as with one slot.
Every running stream steps once per tick, so a long answer never holds the others back, and a long prompt is
read a chunk per tick (`Generation.read_prompt`) while the others answer, in their batch where it fits. A finished
or cancelled request gives its slot back at once, in the tick it ends. A prompt that finds no room in the slots'
one pool beside the running requests (they hold its cells) waits at the head of the queue until one of them ends,
then starts again; the requests behind it may pass it for its first PASS_WAITS waits (a short request need not wait
for a long prompt's room), then wait behind it (so it is never starved); only a prompt that does not fit with
nothing else running is refused.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from localspec.core.slots import SHARED_DRAFTS_ENV, Slot, SlotPool
from localspec.errors import NoRoomError
from localspec.models.flags import RunFlags

from .request import Emit, Event, Job, Outcome, Request, Token, steps
from .served import Served

log = logging.getLogger(__name__)
PASS_WAITS = 2  # times a prompt waits for room while later requests may pass it; after that they wait behind it


class Host(Protocol):
    """What the scheduler asks of its runner (server/runner.py: `Runner`): the loaded pair, the engine thread, and a
    job's bookkeeping in the runner's queue."""

    @property
    def served(self) -> Served | None:
        """The loaded pair, if any."""

    @property
    def flags(self) -> RunFlags:
        """The command line's settings (`max_tokens`, what `with_flags` adds)."""

    def call_on_engine(self, fn: Callable[[], object]) -> Future:
        """Run `fn` on the engine thread, after what it runs now."""

    def prepare(self, job: Job) -> Served:
        """The pair `job` runs on, loaded again if it was unloaded; raises for a cancelled job (engine thread)."""

    def checked(self, job: Job, work: Generator[None, None, Any]) -> Generator[None, None, Any]:
        """`work` with the job's cancellation checked after each of its parts."""

    def with_flags(self, request: Request) -> Request:
        """The request over the command line's settings."""

    def forget(self, job: Job) -> None:
        """The job has ended: its place in the queue is free."""


@dataclass(eq=False, slots=True)
class Entry:
    """One request in the scheduler: waiting (no `run`), then running in a slot."""

    job: Job
    request: Request | None
    emit: Emit
    work: Callable | None
    future: Future
    run: Generator[None, None, Outcome] | None = None
    slot: Slot | None = None
    answered: bool = False  # a token of it was emitted: it can no longer start again
    room_after: int | None = None  # waiting for room: started before, again once more requests than this have ended
    waits: int = 0  # times its prompt found no room (later requests pass it for PASS_WAITS of them)
    order: int = 0  # its place in arrival order (`Scheduler.add`)


class Scheduler:
    """The waiting and running requests of a `Runner` with N slots; its loop runs on the runner's engine thread.

    Args:
        runner: the runner (its pair, its engine thread, its queue's bookkeeping: `Host`).
        n_slots: most requests generating at once.
    """

    def __init__(self, runner: Host, n_slots: int) -> None:
        self.runner, self.n_slots = runner, n_slots
        self._waiting: deque[Entry] = deque()
        self._active: list[Entry] = []
        self._lock = threading.Lock()
        self._looping = False
        self._pool: SlotPool | None = None
        self._pool_of: Served | None = None  # the pair the pool's slots belong to
        self._ended = 0  # requests ended so far: a prompt waiting for room starts again when this grows
        self._added = 0  # requests queued so far (their arrival order)

    @property
    def busy(self) -> int:
        """Slots generating now (for /health); a job's work (embeddings) holds none."""
        return sum(entry.work is None for entry in self._active)

    def add(self, entry: Entry) -> None:
        """Queue `entry` (any thread); the engine thread's loop starts if it is not running."""
        with self._lock:
            self._added += 1
            entry.order = self._added
            self._waiting.append(entry)
            start, self._looping = not self._looping, True
        if start:
            self.runner.call_on_engine(self._loop)

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._waiting and not self._active:
                        self._looping = False
                        return
                self._admit()
                self._tick()
        except BaseException as e:  # a bug: every request hears of it, the next request starts a new loop
            log.exception("the scheduler stopped")
            with self._lock:
                entries, self._looping = [*self._active, *self._waiting], False
                self._active.clear()
                self._waiting.clear()
            for entry in entries:
                self._settle(entry, error=e)

    def _admit(self) -> None:
        """Start the waiting requests that fit, in order: a free slot each (a job's work needs none). A prompt that
        waits for room (`_wait_for_room`) holds the requests behind it once it has waited PASS_WAITS times; before
        that they pass it (a short request need not wait for a long prompt's room), and one that finds no room
        either waits behind it."""
        while True:
            with self._lock:
                entry = next((e for e in self._waiting if self._may_start(e)), None)
                if entry is None:
                    return
                self._waiting.remove(entry)
            self._start(entry)

    def _may_start(self, entry: Entry) -> bool:
        """Whether `entry` may start now, as `_admit` takes the queue in order (under the lock)."""
        if entry.work is None and self.busy >= self.n_slots:
            return False
        head = self._waiting[0]
        if head.room_after == self._ended and self._active and not head.job.cancelled:  # the head waits for room
            return entry is not head and entry.room_after is None and head.waits <= PASS_WAITS
        return entry is head

    def _start(self, entry: Entry) -> None:
        if entry.room_after is not None:  # started before: it waited for room
            if entry.job.cancelled:
                self._settle(entry)
                return
        elif not entry.future.set_running_or_notify_cancel():
            self._settle(entry)
            return
        try:
            served = self.runner.prepare(entry.job)
            if entry.work is not None:  # a part a tick, beside the streams
                entry.run = self.runner.checked(entry.job, entry.work(served))
                with self._lock:
                    self._active.append(entry)
                return
            pool = self._slots(served)

            def slot(prompt: list[int]) -> Slot:
                assert pool is not None
                if entry.slot is None:
                    entry.slot = pool.acquire(prompt)
                return entry.slot

            assert entry.request is not None  # an entry is a request or a job's work
            request = self.runner.with_flags(entry.request)
            max_tokens = self.runner.flags.max_tokens

            def emit(event: Event) -> None:
                entry.answered = entry.answered or isinstance(event, Token)
                entry.emit(event)

            entry.run = steps(
                served,
                request,
                entry.job,
                emit,
                default_max_tokens=max_tokens,
                slot=slot if pool is not None else None,
                shared=pool,
            )
        except BaseException as e:
            self._settle(entry, error=e)
            return
        with self._lock:
            self._active.append(entry)

    def _slots(self, served: Served) -> SlotPool | None:
        """The loaded pair's slots, made (and warmed) on first use after a load (engine thread); None for a target
        with one sequence (`--parallel auto` on a model that cannot share: its requests run one at a time, on the
        engine's own cache)."""
        if served.engine.target.ctx.n_seq == 1:
            self._pool, self._pool_of = None, served
            return None
        if self._pool is None or self._pool_of is not served:
            shared = os.environ.get(SHARED_DRAFTS_ENV, "on") != "off"  # the yardstick's switch (bench --clients)
            self._pool, self._pool_of = SlotPool(served.engine, self.n_slots, shared_drafts=shared), served
            self._pool.warm()
        return self._pool

    def forget_pair(self) -> None:
        """The pair was unloaded: its slots are gone with its context."""
        self._pool, self._pool_of = None, None

    def prepare(self, served: Served) -> None:
        """Make the slots of a pair just loaded (engine thread): a refusal (`--parallel` on a model that cannot
        take it) is said at start, and their first use is warm."""
        self._slots(served)

    def _tick(self) -> None:
        """One step of every running request: their next rows decoded together first (one stream's alone)."""
        entries, streams = list(self._active), []
        pool = self._pool
        if pool is not None:  # a tick of the streams (a lone step is a tick of one): fixed until its end, so a stream
            # left alone by one that ended earlier in it still takes the row decoded for it
            streams = [(e.slot, gen) for e in entries if e.slot is not None and (gen := e.job.generation) is not None]
            pool.begin(streams, running=sum(e.work is None for e in entries))  # requests, not a job's work
            # The streams whose rows wait in the shared batch step first: a step that decodes on its own (a chunk of
            # a prompt, a verify pass) replaces the context's logits, and the rows after it would be decoded again.
            entries.sort(key=lambda e: not (e.slot is not None and pool.waits(e.slot)))
        for entry in entries:
            assert entry.run is not None  # set when it started
            try:
                next(entry.run)
            except StopIteration as end:
                self._settle(entry, result=end.value)
            except NoRoomError as e:
                if not self._wait_for_room(entry, e):
                    self._settle(entry, error=e)
            except BaseException as e:
                self._settle(entry, error=e)
        if pool is not None:
            pool.end(streams)
        if self._pool is not None:
            self._pool.discard([entry.slot for entry in self._active if entry.slot is not None])

    def _wait_for_room(self, entry: Entry, error: NoRoomError) -> bool:
        """`entry`'s prompt found no room in the pool beside the running requests: back to the head of the queue,
        its slot given back (the cells it read stay an idle slot's, for the prompt cache), to start again once one of
        them ends. False where it cannot wait: it answered already, or nothing else runs that would make room."""
        with self._lock:
            others = [other for other in self._active if other is not entry and other.work is None]
            if entry.answered or not others:
                return False
            self._active.remove(entry)
            entry.run, entry.room_after, entry.waits = None, self._ended, entry.waits + 1
            waiters = itertools.takewhile(lambda e: e.room_after is not None and e.order < entry.order, self._waiting)
            self._waiting.insert(sum(1 for _ in waiters), entry)  # behind the prompts that came before it, ahead of
            # the requests that never waited
        self._release(entry)
        entry.job.generation = None
        log.info("a prompt waits for room beside %d running request(s): %s", len(others), error)
        return True

    def _release(self, entry: Entry) -> None:
        """`entry`'s slot back to the pool, if it holds one."""
        if entry.slot is not None and self._pool is not None:
            self._pool.release(entry.slot)
            entry.slot = None

    def _settle(self, entry: Entry, *, result=None, error: BaseException | None = None) -> None:
        """End `entry`: its slot back, its place in the queue freed, its future settled."""
        with self._lock:
            if entry in self._active:
                self._active.remove(entry)
                self._ended += 1
        self._release(entry)
        self.runner.forget(entry.job)
        if entry.future.done():
            return
        if error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(result)
