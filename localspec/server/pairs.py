"""Every pair the server may answer with, each behind a `Runner` of its own (issue 57): loaded by name on demand,
kept within a count and a memory budget, unloaded when idle past its keep-alive.

A request's `model` names a pair (models.toml's name, or the --target's file names); no `model` is the default pair.
Each pair has its own engine thread and scheduler, so a request for one never waits on another's decode or load; a
request for a pair that is loading waits up to `load_timeout`, then is refused (503). Before a pair loads, the
least recently used idle pairs are unloaded until it fits `max_loaded` and the memory budget (`--max-memory`, and
always the host's available memory), each on its own thread. Like Ollama's `keep_alive`, a pair idle for longer
than its keep-alive (the flag, or the last request's `keep_alive`) is unloaded by a reaper thread. When the server
stops, what waits on an engine thread (a load, room for one, an unload) is answered 503 at once (`until`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from localspec.errors import LocalspecError
from localspec.llama.context import memory_bytes
from localspec.models.flags import RunFlags
from localspec.models.loading import switched
from localspec.paths import Paths

from .api import ApiError
from .request import Emit, Job, Outcome, Request
from .runner import Runner, stopping_error
from .served import Served
from .units import FOREVER

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 300.0  # a request waits this long for its pair to load, then 503
REAP_EVERY_S = 0.5  # how often idle pairs are checked against their keep-alive
FACTS_FOR_S = 10.0  # how long a pair's facts read from its files are kept (a pull may change them)
STOP_POLL_S = 0.1  # how often a wait on an engine thread looks whether the server is stopping


class Pairs:
    """The pairs a server answers with, by name, each with its own `Runner`.

    Args:
        flags: the command line; its pair (or --target files) is the default pair, loaded by `start`.
        paths: localspec's folders.
        names: the models.toml pairs a request may name, in the order `/v1/models` lists them.
        no_swap: serve the default pair (and `chosen`) only: a request for another configured pair is 400.
        chosen: the pairs `--pair` named beyond the default (loaded on demand like the others).
        max_queue, parallel: each pair's runner's (`Runner`).
        max_loaded: most pairs loaded at once (0: no count).
        max_memory: most bytes the loaded pairs' plans may add up to (0: the host's available memory alone).
        keep_alive: seconds an idle pair stays loaded (`FOREVER`: until a budget needs its room).
        load_timeout: seconds a request waits for its pair to load.
    """

    def __init__(
        self,
        flags: RunFlags,
        paths: Paths,
        *,
        names: Sequence[str] = (),
        no_swap: bool = False,
        chosen: Sequence[str] = (),
        max_queue: int = 8,
        parallel: int = 1,
        max_loaded: int = 0,
        max_memory: int = 0,
        keep_alive: float = FOREVER,
        load_timeout: float = LOAD_TIMEOUT_S,
    ) -> None:
        self.flags, self.paths = flags, paths
        self.names = list(names)
        self.no_swap, self.chosen = no_swap, list(chosen)
        self.max_queue, self.parallel = max_queue, parallel
        self.max_loaded, self.max_memory = max_loaded, max_memory
        self.keep_alive, self.load_timeout = keep_alive, load_timeout
        self.default: str | None = None  # the default pair's name, known once `start` loaded it
        self._first: Runner | None = None  # the default pair's runner from its start (stopped even while it loads)
        self.runners: dict[str, Runner] = {}
        self.stopping = False
        self._lock = threading.Lock()
        self._room = threading.Lock()  # one pair at a time makes room for itself
        self._files: dict[str, tuple[float, dict[str, Any]]] = {}  # a pair's facts from its files, and when read
        self._loads: dict[str, Future] = {}  # a load in progress per pair, which its requests wait on together
        self._waiting: dict[Runner, tuple[str, list[str]]] = {}  # a load waiting for room: the bound, the pairs
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()
        # A request's images are preprocessed here before its job, never on an engine thread (server/flow.py).
        self.images = ThreadPoolExecutor(1, thread_name_prefix="localspec-images")

    # --- names --------------------------------------------------------------------------------------------------

    def start(self) -> Served:
        """Load the default pair on its own engine thread (blocking) and start the keep-alive reaper."""
        runner = self._first = self._new_runner(self.flags)
        served = runner.start()
        self.default = served.name
        with self._lock:
            self.runners[served.name] = runner
        if served.name not in self.names:
            self.names.insert(0, served.name)
        self._reaper = threading.Thread(target=self._reap, name="localspec-keep-alive", daemon=True)
        self._reaper.start()
        return served

    def served_names(self) -> list[str]:
        """The pairs a request may name: every configured one, or under --no-swap the default and `chosen`."""
        if self.no_swap:
            return [n for n in self.names if n == self.default or n in self.chosen]
        return list(self.names)

    def name_of(self, model: str | None) -> str:
        """The pair a request's `model` names (None: the default pair).

        Raises:
            ApiError: 404 for a name no pair has, or a pair whose files are not here; 400 for another pair under
                --no-swap.
        """
        if model is None or self.default is None:
            return self.default or ""
        default = self.runners.get(self.default)
        if default is not None and model in _identities(default):
            return self.default
        if model not in self.names:
            known = ", ".join(self.model_ids())
            raise ApiError(
                404,
                f"the model '{model}' does not exist here: use one of {known}",
                param="model",
                code="model_not_found",
            )
        if model not in self.served_names():
            raise ApiError(
                400,
                f"this server serves {', '.join(self.served_names())} only (--no-swap): ask for one of those",
                param="model",
                code="model_not_loaded",
            )
        facts = self.facts(model) if model not in self.runners or self.runners[model].served is None else {}
        if facts.get("damaged"):
            raise ApiError(
                503, f"could not load '{model}': {facts['damaged']}", type="server_error", code="model_load_failed"
            )
        if model not in self.runners and not facts.get("available", True):
            raise ApiError(
                404,
                f"the files of pair '{model}' are not here: run `localspec pull {model}`",
                param="model",
                code="model_not_found",
            )
        return model

    def runner(self, name: str) -> Runner:
        """The runner of pair `name` (made, not loaded, on first use)."""
        with self._lock:
            if name not in self.runners:
                self.runners[name] = self._new_runner(switched(self.flags, name))
            return self.runners[name]

    def _new_runner(self, flags: RunFlags) -> Runner:
        runner = Runner(flags, self.paths, max_queue=self.max_queue, parallel=self.parallel)
        runner.before_load = self._make_room
        return runner

    # --- requests -----------------------------------------------------------------------------------------------

    async def ready(self, model: str | None) -> str:
        """The pair `model` names, loaded: a load started on its engine thread if it is not, and waited for.

        Raises:
            ApiError: as `name_of`; 503 past `load_timeout` (the load goes on) or when it failed (one line).
        """
        name = self.name_of(model)
        runner = self.runner(name)
        if runner.served is not None:
            return name
        future = self._load(name, runner)
        waited = asyncio.wrap_future(future)
        if not await self.until(waited, self.load_timeout):
            waited.add_done_callback(lambda f: f.cancelled() or f.exception())  # its failure is told to the next
            if (waiting := self._waiting.get(runner)) is not None:
                raise ApiError(
                    503,
                    f"the model '{name}' is not loaded yet: it {_waits(*waiting)}; retry shortly",
                    type="server_error",
                    code="no_room",
                    headers={"Retry-After": "5"},
                )
            raise ApiError(
                503,
                f"the model '{name}' is still loading after {self.load_timeout:g} s: retry shortly",
                type="server_error",
                code="model_loading",
                headers={"Retry-After": "5"},
            )
        error = waited.exception()
        if isinstance(error, ApiError):
            raise error
        if error is not None:
            raise ApiError(
                503, f"could not load '{name}': {_one_line(error)}", type="server_error", code="model_load_failed"
            )
        return name

    async def until(self, waited: asyncio.Future, timeout: float | None = None) -> bool:
        """Wait for `waited` (an engine thread's work) at most `timeout` s: True once it is done, False past the
        timeout (the work goes on).

        Raises:
            ApiError: 503 `server_stopping` as soon as the server stops: a client is not kept waiting on an engine
                thread that finishes its step.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.stopping:  # before its result: the engine thread may have ended it because the server stops
                waited.add_done_callback(lambda f: f.cancelled() or f.exception())  # its end is nobody's now
                raise stopping_error()
            if waited.done():
                return True
            left = STOP_POLL_S if deadline is None else min(STOP_POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            await asyncio.wait({waited}, timeout=left)

    def _load(self, name: str, runner: Runner) -> Future:
        """The load of `name` in progress, or a new one on its engine thread."""
        with self._lock:
            future = self._loads.get(name)
            if future is None or future.done():
                future = self._loads[name] = runner.call_on_engine(lambda: runner.served or runner.load())
            return future

    def submit(
        self, model: str | None, request: Request | None, emit: Emit | None = None, work: Callable | None = None
    ) -> tuple[Job, Future[Outcome]]:
        """Queue a request on the runner of the pair `model` names (as `Runner.submit`); a request's `keep_alive`
        becomes its pair's."""
        name = self.name_of(model)
        runner = self.runner(name)
        if request is not None and request.keep_alive is not None:
            runner.keep_alive = request.keep_alive
        runner.last_used = time.monotonic()
        return runner.submit(request, emit, work)

    # --- loading and unloading ----------------------------------------------------------------------------------

    def _make_room(self, loading: Runner, need: int) -> None:
        """Unload idle pairs, least recently used first, until `loading` (needing `need` bytes) fits the count and the
        memory budget (its own engine thread, before its load).

        Raises:
            ApiError: 503 when only busy pairs could make room.
        """
        with self._room:
            deadline = time.monotonic() + self.load_timeout
            try:
                while (over := self._over(loading, need)) is not None:
                    idle = [r for r in self._loaded(loading) if r.pending == 0]
                    if not idle:
                        busy = sorted(_name(r) for r in self._loaded(loading))
                        if self._waiting.get(loading) != (over, busy):
                            log.info("%s %s", _name(loading), _waits(over, busy))
                        self._waiting[loading] = (over, busy)  # for /health and a request's 503
                        if time.monotonic() > deadline:
                            raise ApiError(
                                503, f"no room to load '{_name(loading)}': it {_waits(over, busy)}; retry shortly",
                                type="server_error", code="no_room", headers={"Retry-After": "5"},
                            )  # fmt: skip
                        self._pause()
                        continue
                    victim = min(idle, key=lambda r: r.last_used)
                    log.info("unloading %s to make room (%s)", _name(victim), over)
                    victim.call_on_engine(victim.unload).result()
            finally:
                self._waiting.pop(loading, None)

    def _pause(self) -> None:
        """A tenth of a second of a load waiting for room (its engine thread); the server stopping ends the wait.

        Raises:
            ApiError: 503 `server_stopping`.
        """
        if self.stopping:
            raise stopping_error()
        time.sleep(0.1)

    def _loaded(self, besides: Runner) -> list[Runner]:
        with self._lock:
            return [r for r in self.runners.values() if r is not besides and r.served is not None]

    def _over(self, loading: Runner, need: int) -> str | None:
        """What `loading` would exceed with the pairs loaded now (None: it fits)."""
        loaded = self._loaded(loading)
        if not loaded:
            return None
        if self.max_loaded and len(loaded) + 1 > self.max_loaded:
            return f"--max-loaded {self.max_loaded}"
        if self.max_memory and sum(r.memory for r in loaded) + need > self.max_memory:
            return f"--max-memory {_gib(self.max_memory)}"
        if need > memory_bytes():
            return f"{_gib(need)} needed, {_gib(memory_bytes())} available"
        return None

    def load(self, name: str) -> Future:
        """Load pair `name` now (the admin route), or the load already in progress."""
        return self._load(name, self.runner(name))

    def unload(self, name: str) -> Future:
        """Unload pair `name` on its engine thread once its running requests end (the admin route)."""
        runner = self.runner(name)
        return runner.call_on_engine(runner.unload)

    def _reap(self) -> None:
        """Unload each pair idle past its keep-alive (a thread of its own)."""
        while not self._stop.wait(REAP_EVERY_S):
            now = time.monotonic()
            with self._lock:
                runners = list(self.runners.values())
            for runner in runners:
                keep = runner.keep_alive if runner.keep_alive is not None else self.keep_alive
                if runner.served is not None and runner.pending == 0 and now - runner.last_used >= keep:
                    log.info("unloading %s: idle for %.0f s (keep-alive)", _name(runner), now - runner.last_used)
                    runner.call_on_engine(runner.unload_if_idle)

    # --- what they are --------------------------------------------------------------------------------------------

    def facts(self, name: str) -> dict[str, Any]:
        """What `/v1/models` says of a pair: loaded, available (its files here and not damaged), damaged (None, or
        which file and how to mend it), vision, MTP, context."""
        runner = self.runners.get(name)
        served = runner.served if runner is not None else None
        if served is not None:
            engine = served.engine
            return {
                "loaded": True,
                "available": True,
                "damaged": None,
                "vision": engine.media is not None and engine.media.sees_images,
                "mtp": engine.target_model.n_layer_nextn > 0,
                "context": engine.n_ctx,
            }
        found = self._files.get(name)
        if found is None or time.monotonic() - found[0] > FACTS_FOR_S:
            found = self._files[name] = (time.monotonic(), _file_facts(name, self.paths))
        return {"loaded": False, **{k: v for k, v in found[1].items() if k != "source"}}

    def listed(self, name: str) -> bool:
        """Whether `/v1/models` lists a pair: loaded, or its files here (damaged too: it says so), or the user's own
        (a bundled pair not pulled is answered, with the `localspec pull` line, but not offered)."""
        facts = self.facts(name)
        return (
            facts["loaded"]
            or facts["available"]
            or bool(facts.get("damaged"))
            or self._files.get(name, (0, {}))[1].get("source") == "user"
        )

    def model_ids(self) -> list[str]:
        """The pairs, those loaded first (the most recently used first), then the rest in models.toml's order."""
        names = [n for n in self.served_names() if self.listed(n)]
        with self._lock:
            loaded = [r for n, r in self.runners.items() if r.served is not None and n in names]
        loaded.sort(key=lambda r: -r.last_used)
        first = [_name(r) for r in loaded]
        return first + [n for n in names if n not in first]

    def health(self) -> dict[str, Any]:
        """Each pair loaded or loading: its memory (the plan's bytes), slots and queue."""
        with self._lock:
            runners = dict(self.runners)
        return {
            name: {
                "loaded": r.served is not None,
                "loading": r.loading is not None,
                "waiting": _waiting_facts(self._waiting.get(r)),
                "memory": r.memory,
                "queue": r.pending,
                "slots": {"busy": r.slots_busy, "total": r.parallel},
            }
            for name, r in runners.items()
            if r.served is not None or r.loading is not None
        }

    def default_runner(self) -> Runner | None:
        return self.runners.get(self.default) if self.default else None

    # --- stopping -------------------------------------------------------------------------------------------------

    def cancel_all(self) -> None:
        """Cancel every pair's waiting and running jobs (the server is stopping)."""
        self.stopping = True
        for runner in self._every():
            runner.cancel_all()

    def close(self) -> None:
        """Stop the reaper and the images' thread, close every runner (its engine freed)."""
        self._stop.set()
        self.images.shutdown(wait=True, cancel_futures=True)  # a prepare in progress stops at its next image
        for runner in self._every():
            runner.close()

    def _every(self) -> list[Runner]:
        """Every runner, the default pair's while it is still loading at start too."""
        with self._lock:
            runners = list(self.runners.values())
        return runners + [r for r in (self._first,) if r is not None and r not in runners]


def _identities(runner: Runner) -> set[str]:
    """The names a request may give a loaded pair: its name, its label, and its target's file name."""
    served = runner.served
    if served is None:
        return set()
    return {served.name, served.resolved.label, served.resolved.target.name}


def _name(runner: Runner) -> str:
    return runner.served.name if runner.served is not None else runner.flags.pair or "?"


def _file_facts(name: str, paths: Paths) -> dict[str, Any]:
    """A pair's facts from its files' headers alone (not loaded)."""
    from localspec.models.catalog import load_config
    from localspec.models.pairs import damage, head_layers_of, media_of, pair_status

    try:
        pair = load_config(paths).get(name)
        status = pair_status(pair, paths)
    except LocalspecError:
        return {"available": False, "damaged": None, "vision": None, "mtp": None, "context": None, "source": None}
    media = media_of(status)
    heads = head_layers_of(status)
    n_ctx = pair.model_overrides().get("n_ctx")
    damaged = damage(status, paths) or None  # a header read per file: cheap, and kept FACTS_FOR_S
    return {
        "available": status.downloaded and damaged is None,
        "damaged": damaged,
        "vision": media.vision,
        "mtp": None if heads is None else heads > 0,
        "context": n_ctx,
        "source": pair.source,
    }


def _waits(over: str, busy: list[str]) -> str:
    """What a load waiting for room waits for, after "it": the bound it would exceed and the pairs that hold it."""
    whose = "its requests" if len(busy) == 1 else "their requests"
    return f"waits for room ({over}): for {', '.join(busy)} to finish {whose} and unload"


def _waiting_facts(waiting: tuple[str, list[str]] | None) -> dict[str, Any] | None:
    """/health's `waiting` of a pair: None, or the bound its load waits under and the pairs it waits for."""
    return None if waiting is None else {"for": "room", "limit": waiting[0], "pairs": list(waiting[1])}


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
