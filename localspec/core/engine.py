"""The generation loop: one path for plain, draft-model and n-gram decoding (DESIGN §1).

`speculative_step` drafts k tokens, verifies them with ONE target decode of k+1 rows, accepts or
rejects, and rolls both caches back; k = 0 is plain decoding through the same code. `Generation`
wraps the steps with detokenisation, stop handling, cancellation and stats, yielding one
`TokenEvent` per emitted token; it runs once. `Engine` owns the loaded models and their `KVSequence`s:
the target's, and whatever its drafter declares in `Drafter.caches`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localspec.errors import ContextError, InvalidParamsError
from localspec.llama import rpc, threads
from localspec.llama.compat import check_pair, check_target
from localspec.llama.context import Context as LlamaContext
from localspec.llama.model import Model

from .bridge import VocabBridge
from .drafters import Drafter, Proposal, make_drafter
from .kv import Context, KVSequence, PrefillStopped
from .params import DEFAULT_MAX_TOKENS, LoadParams, SpeculativeParams
from .policy import DraftPolicy, size_ratio
from .sampling import Dist, SamplingParams, greedy_token, penalty_window, sampling_dist
from .stats import Stats, Step
from .textstream import TextStream
from .verify import verify_greedy, verify_match, verify_pq

log = logging.getLogger("localspec.engine")


DEFAULT_N_CTX = 4096
PREFILL_REPORT_MIN = 300  # prompts to read longer than this report their progress (`Generation.on_prefill`)


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One emitted token (or, with token None, the close of a generation ended between steps)."""

    token: int | None
    text: str  # text released with this token ("" while bytes or a possible stop string are held back)
    from_draft: bool
    finish_reason: str | None = None  # "stop", "length", "cancelled" on the last event


class _VerifiedRows(Sequence):
    """The k+1 rows of a verify pass, read lazily: row i sees the drafts x_1..x_i as history."""

    def __init__(self, ctx: Context, recent: list[int], drafts: list[int], sampling: SamplingParams) -> None:
        self._ctx, self._recent, self._drafts, self._sampling = ctx, recent, drafts, sampling
        self._block: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._drafts) + 1

    def _logits(self, i: int) -> np.ndarray:
        """Row i's logits: the pass's rows are one block, found with two native calls whatever k is."""
        if not self._drafts:
            return self._ctx.logits(0)
        if self._block is None:
            self._block = self._ctx.logits_block(len(self._drafts) + 1)
        return self._block[i]

    def _history(self, i: int) -> list[int]:
        return self._recent + self._drafts[:i] if self._sampling.penalised else self._recent


class TargetLaws(_VerifiedRows):
    """The target's sampling laws for the k+1 verified rows, computed lazily."""

    def __init__(self, ctx: Context, recent: list[int], drafts: list[int], sampling: SamplingParams) -> None:
        super().__init__(ctx, recent, drafts, sampling)
        self._rows: dict[int, Dist] = {}

    def __getitem__(self, i: int) -> Dist:
        if i not in self._rows:
            self._rows[i] = sampling_dist(self._logits(i), self._history(i), self._sampling)
        return self._rows[i]


class TargetArgmax(_VerifiedRows):
    """The target's greedy tokens for the k+1 verified rows, computed lazily row by row (the rows after a mismatch
    are never read). Without penalties a row's token is its argmax — taken in the graph where the context has the
    device sampler (only the token id leaves the device), else from the logits; with penalties each row depends
    on the drafts before it and is computed from its logits."""

    def __init__(self, ctx: Context, recent: list[int], drafts: list[int], sampling: SamplingParams) -> None:
        super().__init__(ctx, recent, drafts, sampling)
        self._device = ctx.device_greedy and not sampling.penalised

    def __getitem__(self, i: int) -> int:
        if self._device:
            return self._ctx.sampled_token(i)
        return greedy_token(self._logits(i), self._history(i), self._sampling)


def speculative_step(
    target: KVSequence,
    drafter: Drafter | None,
    history: list[int],
    k: int,
    sampling: SamplingParams,
    spec: SpeculativeParams,
    rng: np.random.Generator,
) -> Step:
    """Emit the next tokens: draft k, verify in one target pass, roll back. k = 0 is plain decoding.

    The target's cache holds history[:-1] before and history[:-1] + emitted[:-1] after; the draft's
    holds at most that.

    Returns:
        What happened: the emitted tokens (the accepted drafts, then one token from the target), the
        counts and the timings. `Stats` and the draft policy both learn from it.
    """
    verify = "pq" if spec.verify == "auto" else spec.verify
    draft_caches = drafter.caches if drafter is not None else ()
    draft_decoded = drafter.n_decoded if drafter is not None else 0
    draft_decoding = _decoding(draft_caches)
    bridging = drafter.seconds_bridging if drafter is not None else 0.0
    t0 = time.perf_counter()
    drafts = Proposal()
    if drafter is not None and k > 0:
        drafts = drafter.propose(history, k, sampling, sample=verify == "pq", p_min=spec.p_min, rng=rng)
    t1 = time.perf_counter()
    target_decoding = target.ctx.seconds_decoding
    n = len(history)
    if target.needs_checkpoint and drafts.tokens:
        target.checkpoint()
    target.append([history[-1], *drafts.tokens], outputs=len(drafts.tokens) + 1)
    t2 = time.perf_counter()
    recent = penalty_window(history, sampling)
    if sampling.greedy:
        n_accepted, token = verify_greedy(drafts.tokens, TargetArgmax(target.ctx, recent, drafts.tokens, sampling))
    else:
        laws = TargetLaws(target.ctx, recent, drafts.tokens, sampling)
        if verify == "pq":
            n_accepted, token = verify_pq(drafts.tokens, drafts.dists, laws, rng)
        else:
            n_accepted, token = verify_match(drafts.tokens, laws, rng)
    t3 = time.perf_counter()
    target.rollback_to(n + n_accepted)
    if drafter is not None:
        drafter.keep(n + n_accepted)
    tokens = tuple((t, True) for t in drafts.tokens[:n_accepted]) + ((token, False),)
    return Step(
        tokens,
        len(drafts.tokens),
        n_accepted,
        seconds_draft=t1 - t0,
        seconds_verify=t2 - t1 + time.perf_counter() - t3,
        seconds_sampling=t3 - t2,
        draft_decoded=(drafter.n_decoded if drafter is not None else 0) - draft_decoded,
        seconds_draft_decode=_decoding(draft_caches) - draft_decoding,
        seconds_verify_decode=target.ctx.seconds_decoding - target_decoding,
        seconds_bridging=(drafter.seconds_bridging if drafter is not None else 0.0) - bridging,
    )


def _decoding(caches: tuple[KVSequence, ...]) -> float:
    """Seconds these caches' contexts have spent inside llama_decode so far."""
    return sum(seq.ctx.seconds_decoding for seq in caches)


class Generation:
    """A running generation: iterate it once for `TokenEvent`s, then read `tokens`, `text`, `stats`.

    Stopping early (break, `close()`, `cancel()` from another thread) leaves both caches consistent:
    every step finishes its rollback before anything is yielded. A second iteration raises
    RuntimeError: the caches have moved on, and `on_finish` has been called.
    """

    def __init__(
        self,
        engine: Engine,
        prompt: list[int],
        *,
        sampling: SamplingParams,
        spec: SpeculativeParams,
        max_tokens: int,
        stop: Sequence[str] = (),
        rng: np.random.Generator | None = None,
    ) -> None:
        if not prompt:
            raise InvalidParamsError("the prompt is empty: give some text to continue")
        if max_tokens < 1:
            raise InvalidParamsError("max-tokens must be at least 1")
        if len(prompt) >= engine.n_ctx:
            raise ContextError(
                f"the prompt is {len(prompt)} tokens but the context holds {engine.n_ctx}: shorten it or raise --n-ctx"
            )
        self.engine, self.prompt, self.sampling, self.spec = engine, list(prompt), sampling, spec
        self.max_tokens = max_tokens
        self.rng = rng if rng is not None else np.random.default_rng(sampling.seed)
        self.stats = Stats(prompt_tokens=len(prompt))
        self.tokens: list[int] = []
        self.from_draft: list[bool] = []
        self.finish_reason: str | None = None
        self.notices: list[str] = []  # things the user should be told (e.g. old turns dropped)
        self.on_finish: Callable[[Generation], None] | None = None
        # Called as on_prefill(model, decoded, total) while a long prompt is read ("target" or "draft").
        self.on_prefill: Callable[[str, int, int], None] | None = None
        self._text = TextStream(stop)
        self._cancel = threading.Event()
        self._started = False

    @property
    def text(self) -> str:
        return self._text.text

    def cancel(self) -> None:
        """Ask the generation to stop after the current step (thread-safe)."""
        self._cancel.set()

    def __iter__(self) -> Iterator[TokenEvent]:
        """The events of this generation, once.

        Raises:
            RuntimeError: at the first event of a second iteration (it would re-sync the caches and call
                `on_finish` again); call `Engine.generate` for a new generation.
        """
        if self._started:
            raise RuntimeError("this Generation has already run: call Engine.generate for a new one")
        self._started = True
        start = time.perf_counter()
        try:
            yield from self._run()
        except GeneratorExit:
            raise  # closed at a yield: between steps, the caches are consistent
        except BaseException:
            self.engine.repair()  # a step cut short (Ctrl+C inside a decode or a rollback): roll it back
            raise
        finally:
            self.stats.seconds = time.perf_counter() - start
            self.finish_reason = self.finish_reason or "cancelled"
            self.engine.check_invariants()
            if self.on_finish is not None:
                self.on_finish(self)

    def _run(self) -> Iterator[TokenEvent]:
        engine, stats = self.engine, self.stats
        t0 = time.perf_counter()
        engine.policy.start()
        try:
            stats.prefill_decoded = engine.target.sync(self.prompt[:-1], progress=self._prefill_progress("target"))
            # A prompt longer than a shorter draft context: no drafting (the room check keeps k at 0).
            drafter_room = engine.drafter is not None and len(self.prompt) < engine.drafter.n_ctx
            if drafter_room and engine.policy.wants_draft(self.spec.adaptive):
                stats.draft_prefill_decoded = engine.drafter.prefill(
                    self.prompt, progress=self._prefill_progress("draft")
                )
        except PrefillStopped:  # Esc while reading a long prompt: the caches hold what was read so far
            yield self._finish(None, "cancelled")
            return
        finally:
            stats.seconds_prefill = time.perf_counter() - t0
        history = list(self.prompt)
        while True:
            reason = self._reason_to_stop(history)
            if reason:
                yield self._finish(None, reason)
                return
            # With a fixed seed, k must not depend on the clock: the sampled text would too.
            k = engine.draft_length(
                self.spec, self.max_tokens - len(self.tokens), len(history), stats, timed=self.sampling.seed is None
            )
            if engine.threads is not None:
                engine.threads.check()
            step = speculative_step(engine.target, engine.drafter, history, k, self.sampling, self.spec, self.rng)
            engine.check_invariants()
            stats.record_step(step)
            engine.policy.observe(step)
            for token, from_draft in step.tokens:
                history.append(token)
                self.tokens.append(token)
                self.from_draft.append(from_draft)
                if token in engine.eog:
                    yield self._finish(token, "stop", from_draft)
                    return
                text = self._text.push(engine.target_model.token_bytes(token))
                if self._text.stopped:
                    yield self._finish(token, "stop", from_draft, text)
                    return
                if len(self.tokens) >= self.max_tokens:
                    yield self._finish(token, "length", from_draft, text)
                    return
                yield TokenEvent(token, text, from_draft)

    def _prefill_progress(self, model: str) -> Callable[[int, int], bool]:
        def report(done: int, total: int) -> bool:
            if self.on_prefill is not None and total >= PREFILL_REPORT_MIN:
                self.on_prefill(model, done, total)
            return not self._cancel.is_set()

        return report

    def _reason_to_stop(self, history: list[int]) -> str | None:
        if self._cancel.is_set():
            return "cancelled"
        if len(history) > self.engine.n_ctx:  # the cache holds history[:-1]: no cell left for the last token
            self.notices.append(
                f"the context is full ({self.engine.n_ctx} tokens): the answer was cut short; "
                "raise --n-ctx or shorten the prompt"
            )
            return "length"
        return None

    def _finish(self, token: int | None, reason: str, from_draft: bool = False, text: str = "") -> TokenEvent:
        self.finish_reason = reason
        if token is not None:
            # Tokens past the end of the step were counted as emitted; the user sees only these.
            self.stats.emitted = len(self.tokens)
        return TokenEvent(token, text + self._text.flush(), from_draft, reason)


class Engine:
    """A target model, an optional drafter, and their caches — kept warm across generations.

    Build it with `Engine.load(...)` and close it (or use `with`) to free the native memory.
    """

    def __init__(
        self,
        target_model: Model,
        target: KVSequence,
        drafter: Drafter | None,
        *,
        owned: Sequence = (),
        auto_threads: bool = False,
        bridge: VocabBridge | None = None,
    ) -> None:
        self.target_model = target_model
        self.target = target
        self.drafter = drafter
        # Every cache the engine keeps consistent: the target's first, then the drafter's own.
        self.caches: tuple[KVSequence, ...] = (target, *(drafter.caches if drafter is not None else ()))
        self.eog = target_model.eog_tokens()
        self.n_ctx = target.ctx.n_ctx
        self._owned = list(owned)
        # Threads follow the cores other processes leave free, unless the caller fixed them.
        self.threads = threads.ThreadTuner([seq.ctx for seq in self.caches]) if auto_threads else None
        self.policy = DraftPolicy(drafter, draft_size_ratio=size_ratio(target_model, drafter))
        self.cannot_roll_back = ""  # set when speculation would force a full re-prefill every step
        self.bridge = bridge  # how the draft drafts when its vocabulary is not the target's (None: same vocabulary)
        for seq in self.caches:
            if seq.mode == "refill" and seq.probed:
                self.cannot_roll_back = f"{seq.ctx.model.path.name} can neither drop a KV tail nor restore a state"
                log.warning("speculation off: %s", self.cannot_roll_back)

    @classmethod
    def load(
        cls,
        target_path: str | Path,
        draft_path: str | Path | None = None,
        params: LoadParams | None = None,
        *,
        progress: Callable[[float], None] | None = None,
        **options: Any,
    ) -> Engine:
        """Load the target (and the draft) and create their contexts.

        Args:
            target_path: the target GGUF.
            draft_path: the draft GGUF (required when the drafter is "model" or "model+ngram").
            params: how to load (drafter, n_ctx, threads, RPC workers, …); default `LoadParams()`. The draft's
                context is capped at its own training context (drafting pauses past it).
            progress: called with the fraction of the target's weights loaded (0..1).
            **options: fields of `LoadParams` replaced in `params` (`Engine.load(path, drafter="none")`).

        Raises:
            LocalspecError: bad files, incompatible draft, n_ctx too large, unknown drafter.
        """
        params = dataclasses.replace(params or LoadParams(), **options)
        if params.uses_draft_model and draft_path is None:
            raise InvalidParamsError(f"--drafter {params.drafter} needs --draft PATH (or use --drafter ngram or none)")
        owned: list = []
        try:
            workers = tuple(rpc.Endpoint.parse(e) for e in params.rpc)
            placement = _own(owned, rpc.attach(workers)) if workers else None
            target_model = _own(
                owned,
                Model(target_path, n_gpu_layers=params.n_gpu_layers, placement=placement, progress=progress),
            )
            check_target(target_model)
            draft_model = bridge = None
            if params.uses_draft_model:
                draft_model = _own(owned, Model(draft_path, n_gpu_layers=params.n_gpu_layers))
                if check_pair(target_model, draft_model, hint=params.compat_hint).kind == "bridged":
                    bridge = VocabBridge(target_model, draft_model, params.bridge)
            speculating = params.drafter != "none"
            n_ctx = params.n_ctx or min(DEFAULT_N_CTX, target_model.info.n_ctx_train)
            target = _sequence(owned, target_model, n_ctx, params, speculating)
            draft = None
            if draft_model is not None:
                draft_n_ctx = min(n_ctx, draft_model.info.n_ctx_train)
                draft = _sequence(owned, draft_model, draft_n_ctx, params, True)
            for seq in (target, draft):  # not timed: the policy must not judge the draft by a cold first step
                if seq is not None:
                    seq.warm()
            drafter = make_drafter(params.drafter, draft, bridge)
            auto_threads = params.n_threads is None
            return cls(target_model, target, drafter, owned=owned, auto_threads=auto_threads, bridge=bridge)
        except BaseException:
            for obj in reversed(owned):
                obj.close()
            raise

    def use_drafter(self, drafter: Drafter | None, policy: DraftPolicy | None = None) -> DraftPolicy:
        """Draft with `drafter` from the next generation on (the server's per-request drafter); its caches join
        the engine's. A drafter may share a cache with the one it replaces (`make_drafter` on the same draft
        sequence): the cache's token list stays its truth.

        Args:
            drafter: the drafter, or None for plain decoding.
            policy: the draft-length policy this drafter used before (kept by the caller); None: a fresh one.

        Returns:
            The policy now in use (keep it to hand back when this drafter is used again).
        """
        self.drafter = drafter
        self.caches = (self.target, *(drafter.caches if drafter is not None else ()))
        self.policy = policy or DraftPolicy(drafter, draft_size_ratio=size_ratio(self.target_model, drafter))
        return self.policy

    @property
    def drafting_note(self) -> str:
        """What the user is told once about how the draft drafts ("" for a draft with the target's vocabulary)."""
        drafts_with_model = self.drafter is not None and self.drafter.needs_model
        return self.bridge.describe() if self.bridge is not None and drafts_with_model else ""

    def draft_length(
        self, spec: SpeculativeParams, remaining: int, n_history: int, stats: Stats, *, timed: bool = True
    ) -> int:
        """k for the next step: the policy's (draft_max unless adaptive), bounded by what is wanted and the room."""
        if self.drafter is None or spec.draft_max == 0 or self.cannot_roll_back:
            stats.speculation_off = "no drafter" if self.drafter is None else self.cannot_roll_back or "draft-max is 0"
            stats.draft_length = 0
            return 0
        # The target decodes history[-1] + k drafts; the draft holds history + k - 1 of them.
        room = min(self.n_ctx - n_history, self.drafter.n_ctx - n_history + 1)
        limit = max(0, min(spec.draft_max, remaining - 1, room))
        choice = self.policy.choose(spec.adaptive, limit, timed=timed)
        stats.record_choice(choice.k, choice.reason, probe=choice.probe)
        stats.decision = self.policy.decision
        return choice.k

    def generate(
        self,
        prompt: list[int],
        *,
        sampling: SamplingParams = SamplingParams(),
        spec: SpeculativeParams = SpeculativeParams(),
        max_tokens: int = DEFAULT_MAX_TOKENS,
        stop: Sequence[str] = (),
        rng: np.random.Generator | None = None,
    ) -> Generation:
        """Start a generation continuing `prompt` (token ids). Iterate the result to run it."""
        return Generation(self, prompt, sampling=sampling, spec=spec, max_tokens=max_tokens, stop=stop, rng=rng)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Tokenize raw text for the target (BOS as the model wants; markup is NOT parsed)."""
        return self.target_model.tokenize(text, add_special=add_special, parse_special=False)

    def seconds_decoding(self) -> float:
        """Time spent inside llama_decode by every cache's model so far (what is not Python)."""
        return sum(seq.ctx.seconds_decoding for seq in self.caches)

    def check_invariants(self) -> None:
        """Each cache holds exactly its token list (DESIGN §1, step 4)."""
        for seq in self.caches:
            seq.check()

    def repair(self) -> None:
        """Bring each cache back in line with its token list after an interrupted step (see `KVSequence.repair`)."""
        for seq in self.caches:
            seq.repair()

    @property
    def closed(self) -> bool:
        """Whether `close()` has freed the contexts and models."""
        return not self._owned

    def close(self) -> None:
        """Free contexts and models now."""
        for obj in reversed(self._owned):
            obj.close()
        self._owned.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _own(owned: list, obj):
    owned.append(obj)
    return obj


def _sequence(owned: list, model: Model, n_ctx: int, params: LoadParams, speculating: bool) -> KVSequence:
    swa_full = params.swa_full
    if swa_full is None:
        # A sliding-window cache drops cells a long rollback needs; the full cache keeps them.
        swa_full = speculating and model.info.n_swa > 0
    # Greedy tokens from the graph: on a GPU only a token id leaves the device. On a CPU the logits are read here
    # anyway, and a numpy argmax measured as fast (README, "Where sampling runs").
    # The draft's law at T > 0 from the graph (top-k candidates only) is for `on` alone: on this CPU and on an H100
    # (8B/1B shapes) the in-graph top-k cost more than the Python it saved.
    device = params.device_sampling == "on" or (params.device_sampling == "auto" and model.on_local_gpu)
    ctx = _own(
        owned,
        LlamaContext(
            model,
            n_ctx=n_ctx,
            swa_full=swa_full,
            n_threads=params.n_threads,
            device_greedy=device,
            device_topk=params.device_sampling == "on",
        ),
    )
    return KVSequence(ctx, rollback=params.rollback)
