"""The one loaded pair behind the server and the one thread that drives it: requests in arrival order (DESIGN §8).

llama.cpp calls block and the caches are one state, so every request is a job on a single worker thread (a
one-thread executor), which alone touches the `Engine`; its scheduler (server/scheduler.py) runs the jobs there, in
slots — one, or several stepping in turn — in arrival order. Successive requests share the
KV prefix the previous one left in both caches (`KVSequence.sync`), so a chat that grows by one turn decodes only
that turn. At most `max_queue` jobs wait or run; past that a request is refused at once (503). A request for
another configured pair loads it on the worker thread, in its turn, like Ollama; `no_swap` refuses instead.
A job whose client went away is cancelled: its generation stops after the current step, caches consistent. When the
server stops (`cancel_all`) every job is cancelled, new ones are refused and a load in progress is abandoned at its
next tensor (`stopping_error`: what every waiting client is answered), so the engine thread ends within one step.
The first load runs on that thread too (`start`): llama.cpp's OpenMP keeps a pool of threads per calling thread, and a
pair loaded on the main thread and decoded on the worker ran at 0.57× `generate` on 2 cores, two pools fighting for
the cores (DESIGN §7, threads).
What one request does on the pair is server/request.py's; the pair itself (its drafters) is server/served.py's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from localspec.core.load import AUTO_SLOTS
from localspec.errors import LocalspecError
from localspec.models.flags import RunFlags
from localspec.models.loading import PairLoad, load_engine, load_with_flags
from localspec.paths import Paths

from .api import ApiError
from .request import Emit, Event, Job, Outcome, Request
from .scheduler import Entry, Scheduler
from .served import Served

log = logging.getLogger(__name__)


class Runner:
    """The loaded pair, the worker thread, the bounded queue. Its scheduler asks of it only what the scheduler's
    `Host` protocol names (server/scheduler.py), all public.

    Args:
        flags: the checked command line (`models.flags.RunFlags`): the pair or files, load flags, and `overrides` /
            `max_tokens` / `stop` that apply to every request unless it says otherwise.
        paths: localspec's folders.
        pairs: the names of the configured pairs (models.toml), which a request may switch to.
        no_swap: refuse requests for another pair (400) instead of loading it.
        max_queue: most requests waiting or running; past it, 503.
        parallel: most requests generating at once, each in a slot of the target's context (server/scheduler.py);
            1: one at a time, the others queued; 0 (`--parallel auto`): as many as the loaded target can share
            (`core.load.slots_for`: 4, or 1 for a recurrent or hybrid target or an MTP head), decided at each load.
    """

    def __init__(
        self,
        flags: RunFlags,
        paths: Paths,
        *,
        pairs: Sequence[str] = (),
        no_swap: bool = False,
        max_queue: int = 8,
        parallel: int = 1,
    ) -> None:
        self.flags, self.paths = flags, paths
        self.pairs = tuple(pairs)
        self.no_swap = no_swap
        self.max_queue = max_queue
        self.auto = parallel == 0
        self.parallel = parallel or AUTO_SLOTS  # until a load says how many the target takes
        self.scheduler = Scheduler(self, self.parallel)  # one path for one slot and for several
        self.served: Served | None = None
        self.loading: str | None = None  # the pair being loaded (a switch in progress), for /health
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-engine")
        self._lock = threading.Lock()
        self._jobs: list[Job] = []  # waiting or running
        self.stopping = False  # the server is stopping: what it cannot answer now is 503 + Retry-After
        # Several pairs at once (server/pairs.py): told before a load the bytes it plans, to make room; the pair's
        # planned bytes while loaded; its last request's time and keep-alive (None: the server's).
        self.before_load: Callable[[Runner, int], None] | None = None
        self.memory = 0
        self.last_used = time.monotonic()
        self.keep_alive: float | None = None

    # --- the pair ---------------------------------------------------------------------------------------------

    def start(self) -> Served:
        """Load the flags' pair on the worker thread, the one that will decode it; blocking."""
        return self._executor.submit(self.load).result()

    def load(self, pair: str | None = None) -> Served:
        """Load the flags' pair (or `pair`, replacing the loaded one); blocking. On the worker thread: `start` at the
        beginning, a job's swap later. The load is the chat's too (`models.loading.load_with_flags`)."""
        old, need = self.served, 0

        def before(plan: PairLoad) -> None:  # resolved: the old pair freed, room made for this one
            nonlocal need
            self.served, self.loading = None, plan.name
            if old is not None:
                _free(old)
            need = _planned_bytes(plan.resolved, plan.params)
            if self.before_load is not None:
                self.before_load(self, need)
            log.info("loading %s (%s) …", plan.name, plan.resolved.label)

        n_seq = 0 if self.auto else self.parallel
        try:
            loaded = load_with_flags(
                self.flags, self.paths, pair=pair, n_seq=n_seq, on_fraction=_log_progress(self), before=before
            )
        except BaseException as e:
            if self.stopping and isinstance(e, Exception):  # abandoned (or failed) as the server stops: no reload
                log.info("the load of %s ended: the server is stopping", pair or self.flags.pair or "the pair")
                raise stopping_error() from None
            if old is not None and self.served is None and pair is not None:  # freed for the switch that failed
                log.info("reloading %s after the failed switch", old.name)
                self.served = _reload(old)
            raise
        finally:
            self.loading = None
        name, resolved, engine, params = loaded.name, loaded.resolved, loaded.engine, loaded.params
        assert engine is not None  # a load returns its engine
        self.served = Served(
            name,
            resolved,
            engine,
            params,
            self.flags.chat_template,
            think_flag=self.flags.think,
        )
        self.memory, self.last_used = need, time.monotonic()
        log.info("loaded %s: n_ctx %d, drafter %s", name, engine.n_ctx, engine.drafter.kind)
        # The slots this target takes (a switch may change them; the scheduler serves one as well).
        if self.auto:
            self.parallel = self.scheduler.n_slots = engine.target.ctx.n_seq
            log.info(
                "%d slots sharing one pool of %d tokens%s",
                self.parallel,
                engine.n_ctx,
                f": {engine.slots_note}" * bool(engine.slots_note),
            )
        if self.stopping:  # stopped while it loaded: no slots made and warmed for a server that exits
            raise stopping_error()
        self.scheduler.prepare(self.served)
        return self.served

    def unload(self) -> None:
        """Free the loaded pair (engine thread, between the scheduler's runs: none of its requests runs)."""
        served, self.served, self.memory = self.served, None, 0
        if served is not None:
            self.scheduler.forget_pair()
            _free(served)
            log.info("unloaded %s", served.name)

    def unload_if_idle(self) -> None:
        """`unload`, unless a request came in since it was asked (the keep-alive's)."""
        if self.pending == 0:
            self.unload()

    def model_ids(self) -> list[str]:
        """The loaded pair first, then every configured pair."""
        loaded = [self.served.name] if self.served is not None else []
        return loaded + [p for p in self.pairs if p not in loaded]

    def pair_for(self, model: str | None) -> str | None:
        """The pair a request's `model` asks to switch to, or None for the loaded one.

        Raises:
            ApiError: 404 for a name neither loaded nor configured; 400 for another pair under --no-swap.
        """
        served = self.served
        if model is None or (served is not None and model in (served.name, served.resolved.label)):
            return None
        if model not in self.pairs:
            known = ", ".join(self.model_ids())
            raise ApiError(
                404,
                f"the model '{model}' does not exist here: use one of {known}",
                param="model",
                code="model_not_found",
            )
        if self.no_swap:
            loaded = served.name if served is not None else "none"
            raise ApiError(
                400,
                f"this server serves '{loaded}' only (--no-swap): ask for that model",
                param="model",
                code="model_not_loaded",
            )
        return model

    # --- the queue --------------------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._jobs)

    @property
    def n_ctx(self) -> int | None:
        """The positions each slot may reach, and the cells of the one pool they share (None: not loaded)."""
        served = self.served
        return served.engine.n_ctx if served is not None else None

    @property
    def slots_busy(self) -> int:
        """Requests generating now (at most `parallel`)."""
        return self.scheduler.busy

    def submit(
        self, model: str | None, request: Request | None, emit: Emit | None = None, work: Callable | None = None
    ) -> tuple[Job, Future[Outcome]]:
        """Queue `request` (for the pair `model` names); the future gives its `Outcome`.

        `emit` (called on the worker thread) receives `Started`, then a `Token` for each token and an `Ended` for
        each choice (server/request.py). `work` instead of a request: `work(served)`, a generator, runs in the
        job's turn on the worker thread, part by part (each `yield` ends a part): between parts a cancelled job
        stops and, with several slots, the running streams step; the future gives what it returns (the embeddings
        route's use of the pair).

        Raises:
            ApiError: 404 / 400 for the model (see `pair_for`); 503 with Retry-After when the queue is full or the
                server is stopping.
        """
        pair = self.pair_for(model)
        job = Job()
        with self._lock:
            if self.stopping:
                raise stopping_error()
            if len(self._jobs) >= self.max_queue:
                raise ApiError(
                    503,
                    f"the server is busy ({len(self._jobs)} requests queued): retry shortly",
                    type="server_error",
                    code="queue_full",
                    headers={"Retry-After": "1"},
                )
            self._jobs.append(job)
        future: Future[Outcome] = Future()
        self.scheduler.add(Entry(job, pair, request, emit or _ignore, work, future))
        return job, future

    def cancel_all(self) -> None:
        """Cancel every waiting and running job (the server is stopping)."""
        with self._lock:
            self.stopping = True
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()

    def close(self) -> None:
        """Cancel what is queued, wait for the worker, free the engine."""
        self.cancel_all()
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self.served is not None:
            _free(self.served)
            self.served = None

    def call_on_engine(self, fn: Callable[[], object]) -> Future:
        """Run `fn` on the engine thread, after the jobs queued there (the scheduler's loop)."""
        return self._executor.submit(fn)

    def with_flags(self, request: Request) -> Request:
        """The request over the command line's settings: its options first, then the flags'."""
        flags = self.flags
        return dataclasses.replace(
            request,
            overrides={**flags.overrides, **request.overrides},
            stop=request.stop or flags.stop,
        )

    def prepare(self, job: Job, pair: str | None) -> Served:
        """The pair a job runs on, switched to if it asks for another (engine thread); raises for a cancelled job."""
        self._unless_cancelled(job, "before it began")
        if pair is not None and (self.served is None or self.served.name != pair):
            self.load(pair)
            self._unless_cancelled(job, "while its pair loaded")  # not an empty 200
        if self.served is None:  # unloaded (idle, or to make room) since the request was queued: load it again
            self.load()
            self._unless_cancelled(job, "while its pair loaded")
        assert self.served is not None
        return self.served

    def checked(self, job: Job, work: Generator[None, None, Any]) -> Generator[None, None, Any]:
        """A job's `work` with the job's cancellation checked after each of its parts."""
        while True:
            try:
                next(work)
            except StopIteration as end:
                return end.value
            self._unless_cancelled(job, "while it ran")
            yield

    def forget(self, job: Job) -> None:
        """The job has ended: its place in the queue is free."""
        job.generation = None
        self.last_used = time.monotonic()
        with self._lock:
            if job in self._jobs:
                self._jobs.remove(job)

    def _unless_cancelled(self, job: Job, when: str) -> None:
        """Raise for a job cancelled before it generated: 503 + Retry-After when the server is stopping (a client
        may retry on the next one), 499 when its client went away."""
        if not job.cancelled:
            return
        log.info("a request cancelled %s (%s)", when, "server stopping" if self.stopping else "client gone")
        if self.stopping:
            raise stopping_error()
        raise ApiError(499, "the request was cancelled", code="cancelled")


def stopping_error() -> ApiError:
    """What a request the server cannot answer because it stops is told: 503 + Retry-After, as the server's error
    (a client may retry on the next server)."""
    return ApiError(
        503, "the server is stopping: retry shortly", type="server_error", code="server_stopping",
        headers={"Retry-After": "1"},
    )  # fmt: skip


def _free(served: Served) -> None:
    if served.embedder is not None:  # a context over the target's model: freed before the model
        served.embedder.close()
    served.engine.close()


def _planned_bytes(resolved, params) -> int:
    """What the pair's load plan puts in memory, GPU and host together (0 when it cannot be planned: the load
    itself then says why)."""
    from localspec.core.load import plan_load

    try:
        plan = plan_load(resolved.target, resolved.draft, params)
    except LocalspecError:
        return 0
    return plan.gpu_bytes + plan.host_bytes


def _reload(old: Served) -> Served | None:
    try:
        engine = load_engine(old.resolved.target, old.resolved.draft, old.params)
    except LocalspecError as e:
        log.error("could not reload %s: %s", old.name, e)
        return None
    return Served(old.name, old.resolved, engine, old.params, old.chat_template, think_flag=old.think_flag)


def _log_progress(runner: Runner) -> Callable[[float], bool]:
    """The load's progress in tenths, in the log; False (stop loading) once the server is stopping."""
    shown = [-1]

    def on_fraction(fraction: float) -> bool:
        tenth = int(fraction * 10)
        if tenth != shown[0]:
            shown[0] = tenth
            log.info("loading %s: %d%%", runner.loading, tenth * 10)
        return not runner.stopping

    return on_fraction


def _ignore(_: Event) -> None:
    pass
