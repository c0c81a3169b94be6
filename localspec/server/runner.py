"""The one loaded pair behind the server and the one thread that drives it: requests in arrival order (DESIGN §8).

llama.cpp calls block and the caches are one state, so every request is a job on a single worker thread (a
one-thread executor: first come, first served), which alone touches the `Engine`. Successive requests share the
KV prefix the previous one left in both caches (`KVSequence.sync`), so a chat that grows by one turn decodes only
that turn. At most `max_queue` jobs wait or run; past that a request is refused at once (503). A request for
another configured pair loads it on the worker thread, in its turn, like Ollama; `no_swap` refuses instead.
A job whose client went away is cancelled: its generation stops after the current step, caches consistent.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localspec.core.drafters import Drafter, make_drafter
from localspec.core.engine import Engine, Generation
from localspec.core.kv import KVSequence
from localspec.core.params import DEFAULT_MAX_TOKENS, LoadParams, PairDefaults, needs_draft_model
from localspec.core.policy import DraftPolicy
from localspec.core.session import ChatFormat, Message
from localspec.core.thinking import ANSWER, ThinkingSplit, choose_thinking, thinking_choice
from localspec.errors import ChatTemplateError, LocalspecError
from localspec.models.loading import (
    RunFlags,
    load_engine,
    load_params,
    resolve_models,
    sampling_params,
    speculative_params,
)
from localspec.models.resolved import ResolvedPair
from localspec.paths import Paths

from .api import ApiError

log = logging.getLogger(__name__)

Emit = Callable[[tuple], None]


@dataclass(slots=True)
class Served:
    """The loaded pair: its engine, the name clients use for it, and what it was loaded with."""

    name: str
    resolved: ResolvedPair
    engine: Engine
    params: LoadParams
    chat_template: str | None
    _format: ChatFormat | None = None
    drafter: str = ""  # the drafter in use now (a request may ask for another)
    think_flag: bool | None = None  # `serve --think on|off`
    _drafters: dict[str, tuple[Drafter, DraftPolicy]] = field(default_factory=dict)  # kind -> kept
    _draft_seq: KVSequence | None = None  # the draft model's cache, which the model drafters share

    def __post_init__(self) -> None:
        self.drafter = self.drafter or self.params.drafter
        drafter = self.engine.drafter
        self._draft_seq = drafter.caches[0] if drafter.needs_model else None

    def use_drafter(self, kind: str) -> None:
        """Draft with `kind` from the next generation on; each drafter keeps its own draft-length policy.

        Raises:
            ApiError: a model drafter on a pair loaded without a draft model.
        """
        if kind == self.drafter:
            return
        if needs_draft_model(kind) and self._draft_seq is None:
            raise ApiError(
                400,
                f"the drafter '{kind}' needs a draft model and this server has none loaded: ask for 'ngram' or "
                "'none', or start the server with a pair that has a draft",
                param="drafter",
                code="unsupported_value",
            )
        engine = self.engine
        self._drafters[self.drafter] = (engine.drafter, engine.policy)
        if kind in self._drafters:
            engine.use_drafter(*self._drafters[kind])
        else:
            engine.use_drafter(make_drafter(kind, self._draft_seq if needs_draft_model(kind) else None, engine.bridge))
        self.drafter = kind

    @property
    def defaults(self) -> PairDefaults:
        return self.resolved.defaults

    def chat_format(self) -> ChatFormat:
        """The chat template, read once (raises ChatTemplateError for a model without one)."""
        if self._format is None:
            self._format = ChatFormat(self.engine.target_model, self.chat_template or self.defaults.chat_template)
        return self._format


@dataclass(frozen=True, slots=True)
class Request:
    """What one HTTP request asks of the engine, checked: exactly one of `messages` and `prompt`."""

    messages: tuple[Message, ...] | None
    prompt: str | None
    n: int = 1
    max_tokens: int | None = None  # None: the server's --max-tokens (an answer that fills the context ends there)
    stop: tuple[str, ...] = ()
    overrides: Mapping[str, Any] = field(default_factory=dict)  # option name -> value, over the server's flags
    penalties: Mapping[str, float] = field(default_factory=dict)  # presence_penalty / frequency_penalty
    drafter: str | None = None
    think: bool | None = None  # chat_template_kwargs.enable_thinking (None: --think, the pair's, the model's)


@dataclass(slots=True)
class Outcome:
    """A finished request: the prompt's length and each choice's generation."""

    served: Served
    prompt_tokens: int
    generations: list[Generation]
    splits: list[ThinkingSplit | None] = field(default_factory=list)  # each choice's thinking split (chat)


class Job:
    """One request's place in the queue; `cancel()` stops its generation after the current step."""

    def __init__(self) -> None:
        self._cancelled = threading.Event()
        self.generation: Generation | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
        if (gen := self.generation) is not None:
            gen.cancel()


class Runner:
    """The loaded pair, the worker thread, the bounded queue.

    Args:
        flags: the checked command line (`models.flags.RunFlags`): the pair or files, load flags, and `overrides` /
            `max_tokens` / `stop` that apply to every request unless it says otherwise.
        paths: localspec's folders.
        pairs: the names of the configured pairs (models.toml), which a request may switch to.
        no_swap: refuse requests for another pair (400) instead of loading it.
        max_queue: most requests waiting or running; past it, 503.
    """

    def __init__(
        self, flags: RunFlags, paths: Paths, *, pairs: Sequence[str] = (), no_swap: bool = False, max_queue: int = 8
    ) -> None:
        self.flags, self.paths = flags, paths
        self.pairs = tuple(pairs)
        self.no_swap = no_swap
        self.max_queue = max_queue
        self.served: Served | None = None
        self.loading: str | None = None  # the pair being loaded (a switch in progress), for /health
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-engine")
        self._lock = threading.Lock()
        self._jobs: list[Job] = []  # waiting or running

    # --- the pair ---------------------------------------------------------------------------------------------

    def load(self, pair: str | None = None) -> Served:
        """Load the flags' pair (or `pair`, replacing the loaded one); blocking. Called at start and by swaps."""
        flags = self.flags if pair is None else dataclasses.replace(self.flags, pair=pair, target=None, draft=None)
        resolved = resolve_models(flags, self.paths)
        params = load_params(flags, resolved.defaults, has_draft=resolved.draft is not None)
        name = resolved.name or resolved.target.name
        log.info("loading %s (%s) …", name, resolved.label)
        old, self.served, self.loading = self.served, None, name
        if old is not None:
            old.engine.close()
        try:
            engine = load_engine(resolved.target, resolved.draft, params, _log_progress(name))
        except BaseException:
            if old is not None and pair is not None:
                log.info("reloading %s after the failed switch", old.name)
                self.served = _reload(old)
            raise
        finally:
            self.loading = None
        self.served = Served(
            name,
            resolved,
            engine,
            params,
            flags.chat_template,
            think_flag=flags.think,
        )
        log.info("loaded %s: n_ctx %d, drafter %s", name, engine.n_ctx, params.drafter)
        return self.served

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

    def submit(self, model: str | None, request: Request, emit: Emit | None = None) -> tuple[Job, Future[Outcome]]:
        """Queue `request` (for the pair `model` names); the future gives its `Outcome`.

        `emit` (called on the worker thread) receives ("start", prompt_tokens, model name), then
        ("token", index, TokenEvent, pieces) for each token — pieces: its text as (part, text, from_draft), a
        reasoning model's thinking apart — and ("end", index, Generation, ThinkingSplit or None) for each choice.

        Raises:
            ApiError: 404 / 400 for the model (see `pair_for`); 503 with Retry-After when the queue is full.
        """
        pair = self.pair_for(model)
        job = Job()
        with self._lock:
            if len(self._jobs) >= self.max_queue:
                raise ApiError(
                    503,
                    f"the server is busy ({len(self._jobs)} requests queued): retry shortly",
                    type="server_error",
                    code="queue_full",
                    headers={"Retry-After": "1"},
                )
            self._jobs.append(job)
        return job, self._executor.submit(self._run_job, job, pair, request, emit or _ignore)

    def cancel_all(self) -> None:
        """Cancel every waiting and running job (the server is stopping)."""
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()

    def close(self) -> None:
        """Cancel what is queued, wait for the worker, free the engine."""
        self.cancel_all()
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self.served is not None:
            self.served.engine.close()
            self.served = None

    def _with_flags(self, request: Request) -> Request:
        """The request over the command line's settings: its options first, then the flags'."""
        flags = self.flags
        return dataclasses.replace(
            request,
            overrides={**flags.overrides, **request.overrides},
            stop=request.stop or flags.stop,
        )

    def _run_job(self, job: Job, pair: str | None, request: Request, emit: Emit) -> Outcome:
        try:
            if job.cancelled:
                raise ApiError(499, "the request was cancelled", code="cancelled")
            if pair is not None and (self.served is None or self.served.name != pair):
                self.load(pair)
            if self.served is None:
                raise ApiError(503, "no model is loaded", type="server_error", code="model_not_loaded")
            return complete(self.served, self._with_flags(request), job, emit, default_max_tokens=self.flags.max_tokens)
        finally:
            job.generation = None
            with self._lock:
                self._jobs.remove(job)


def complete(
    served: Served, request: Request, job: Job, emit: Emit, *, default_max_tokens: int = DEFAULT_MAX_TOKENS
) -> Outcome:
    """Run `request` on the loaded pair (worker thread): tokenize, check the room, generate each choice.

    Raises:
        ApiError: a prompt that does not fit the context, a max_tokens beyond it, a value out of range.
    """
    engine = served.engine
    think = _think(served, request) if request.messages is not None else None
    prompt = _prompt_tokens(served, request, think)
    max_tokens = _max_tokens(served, request, len(prompt), default_max_tokens)
    sampling, spec = _params(served, request)
    rng = np.random.default_rng(sampling.seed)  # one stream: the n choices are independent draws
    emit(("start", len(prompt), served.name))
    generations: list[Generation] = []
    splits: list[ThinkingSplit | None] = []
    for index in range(request.n):
        if job.cancelled:
            break
        gen = engine.generate(prompt, sampling=sampling, spec=spec, max_tokens=max_tokens, stop=request.stop, rng=rng)
        split = served.chat_format().splitter(think) if request.messages is not None else None
        job.generation = gen
        if job.cancelled:  # cancelled between the check and the assignment
            gen.cancel()
        for event in gen:
            pieces = split.feed(event, gen.stats) if split is not None else [(ANSWER, event.text, event.from_draft)]
            emit(("token", index, event, [p for p in pieces if p[1]]))
        if gen.finish_reason == "cancelled":  # the caches are consistent: Generation checked the invariant
            log.info("choice %d cancelled after %d tokens (client gone or server stopping)", index, len(gen.tokens))
        generations.append(gen)
        splits.append(split)
        emit(("end", index, gen, split))
    return Outcome(served, len(prompt), generations, splits)


def _think(served: Served, request: Request) -> bool | None:
    """The thinking switch of a chat request: its own, else the server's --think, else the pair's `thinking`.

    Raises:
        ApiError: the model cannot follow it (400).
    """
    own = thinking_choice(request.think, "request")
    choices = (
        own,
        thinking_choice(served.think_flag, "serve"),
        thinking_choice(served.defaults.thinking, "pair", served.name),
    )
    if not any(choices):
        return None  # the model decides: its template need not even render here
    try:
        support = served.chat_format().thinking
    except ChatTemplateError as e:
        raise ApiError(400, str(e), param="messages", code="chat_template_error") from None
    try:
        return choose_thinking(support, served.name, *choices)
    except LocalspecError as e:
        param = "chat_template_kwargs.enable_thinking" if own is not None else None
        raise ApiError(400, str(e), param=param, code="unsupported_value") from None


def _prompt_tokens(served: Served, request: Request, think: bool | None = None) -> list[int]:
    engine = served.engine
    if request.messages is not None:
        try:
            tokens = served.chat_format().tokens(request.messages, think=think)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="messages", code="chat_template_error") from None
        what = "messages"
    else:
        tokens = engine.tokenize(request.prompt or "")
        what = "prompt"
    if not tokens:
        raise ApiError(400, f"the {what} is empty: give some text to continue", param=what)
    if len(tokens) >= engine.n_ctx:
        raise ApiError(
            400,
            f"the {what} is {len(tokens)} tokens but the context holds {engine.n_ctx}: shorten it, or restart the "
            "server with a larger --n-ctx",
            param=what,
            code="context_length_exceeded",
        )
    return tokens


def _max_tokens(served: Served, request: Request, n_prompt: int, default: int) -> int:
    n_ctx = served.engine.n_ctx
    if request.max_tokens is None:
        return default  # a generation that fills the context ends there ("length")
    if n_prompt + request.max_tokens > n_ctx:
        raise ApiError(
            400,
            f"max_tokens {request.max_tokens} does not fit the context: the prompt is {n_prompt} tokens and the "
            f"context holds {n_ctx}, so at most {n_ctx - n_prompt} can be generated",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return request.max_tokens


def _params(served: Served, request: Request):
    overrides = dict(request.overrides)
    served.use_drafter(request.drafter or served.params.drafter)  # what the request leaves out: the server's
    try:
        sampling = sampling_params(overrides, served.defaults)
        sampling = dataclasses.replace(sampling, **request.penalties)
        spec = speculative_params(overrides, served.defaults)
    except LocalspecError as e:
        raise ApiError(400, str(e)) from None
    return sampling, spec


def _reload(old: Served) -> Served | None:
    try:
        engine = load_engine(old.resolved.target, old.resolved.draft, old.params)
    except LocalspecError as e:
        log.error("could not reload %s: %s", old.name, e)
        return None
    return Served(old.name, old.resolved, engine, old.params, old.chat_template, think_flag=old.think_flag)


def _log_progress(name: str) -> Callable[[float], None]:
    shown = [-1]

    def on_fraction(fraction: float) -> None:
        tenth = int(fraction * 10)
        if tenth != shown[0]:
            shown[0] = tenth
            log.info("loading %s: %d%%", name, tenth * 10)

    return on_fraction


def _ignore(_: tuple) -> None:
    pass
