"""The generation loop: one path for plain, draft-model, n-gram and bridged decoding (DESIGN §1).

`Generation` runs `speculative_step` (core/step.py) until a stop, with detokenisation, stop strings,
cancellation and stats, yielding one `TokenEvent` per emitted token; it runs once. It runs on an engine
(core/engine.py's `Engine`, which owns the models and their caches); core/loopface.py's `Engine` is what it asks of
one, with what it yields and what starts it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from localspec.errors import ContextError, InvalidParamsError, NonFiniteLogitsError, NoRoomError
from localspec.llama.sampler import ChainLawBuilder

from .drafters import Drafter, DraftRequest, Proposal, SharedDrafts
from .draftread import DraftRead
from .grammar import CompiledGrammar, Grammar
from .kv import KVSequence, PrefillStopped, whole_images
from .loopface import Engine, GenerateOptions, TokenEvent
from .params import DEFAULT_MAX_TOKENS, SpeculativeParams
from .policy import DraftPolicy
from .sampling import SamplingParams
from .stats import Stats, TokenLogprob
from .step import admitted, speculative_step, target_chain
from .textstream import TextStream

__all__ = ["Engine", "GenerateOptions", "Generation", "SharedBatch", "Tick", "TokenEvent"]  # some loopface's

log = logging.getLogger(__name__)


class Tick(Protocol):
    """A tick of a shared batch (`serve --parallel`; core/slots.py's `SharedTick`): every running stream's next rows
    decoded in one batch, each stream's step taking its own."""

    def drafts_for(self, generation: Generation) -> Proposal | None:
        """The drafts decoded for `generation`'s step in this tick, handed over once (None: its plain row only)."""
        ...

    def alone(self, generation: Generation) -> bool:
        """Whether `generation` steps as it would alone (its own drafter and policy, its draft's read of its prompt,
        its step's own timing): no other stream's rows are in this tick's batch."""
        ...


class SharedBatch(Protocol):
    """The shared batch a stream may step in (`serve --parallel`; core/slots.py's `SlotPool`)."""

    @property
    def tick(self) -> Tick | None:
        """The tick in progress while the streams step in a shared batch (fixed for the tick); None: each alone."""
        ...


PREFILL_REPORT_MIN = 300  # prompts to read longer than this report their progress (`Generation.on_prefill`)


class Generation:
    """A running generation: iterate it once for `TokenEvent`s, then read `tokens`, `text`, `stats`.

    Stopping early (break, `close()`, `cancel()` from another thread) leaves both caches consistent:
    every step finishes its rollback before anything is yielded. A second iteration raises
    RuntimeError: the caches have moved on, and `on_finish` has been called.
    """

    def __init__(
        self,
        engine: Engine,  # core/engine.py's, as the `Engine` protocol below says what it is asked
        prompt: list[int],
        *,
        sampling: SamplingParams = SamplingParams(),
        spec: SpeculativeParams = SpeculativeParams(),
        max_tokens: int = DEFAULT_MAX_TOKENS,
        stop: Sequence[str] = (),
        rng: np.random.Generator | None = None,
        grammar: Grammar | CompiledGrammar | None = None,
        logprobs: int | None = None,
        target: KVSequence | None = None,
        drafter: Drafter | None = None,
        policy: DraftPolicy | None = None,
    ) -> None:
        if not prompt:
            raise InvalidParamsError("the prompt is empty: give some text to continue")
        if max_tokens < 1:
            raise InvalidParamsError("max-tokens must be at least 1")
        if prompt[-1] < 0:
            raise InvalidParamsError("the prompt ends with an image: write some text after it")
        if len(prompt) >= engine.n_ctx:
            raise ContextError(
                f"the prompt is {len(prompt)} tokens but the context holds {engine.n_ctx}: shorten it or raise --n-ctx"
            )
        self.engine, self.prompt, self.sampling, self.spec = engine, list(prompt), sampling, spec
        self.target = target if target is not None else engine.target
        # This stream's own drafter and policy: nothing another stream asks changes them.
        self.drafter = drafter if drafter is not None else engine.drafter
        if policy is None:
            policy = engine.policy if drafter is None else DraftPolicy(draft_size_ratio=self.drafter.size_ratio)
        self.policy = policy
        self.max_tokens = max_tokens
        self.rng = rng if rng is not None else np.random.default_rng(sampling.seed)
        # The grammar's matcher for this generation (compiled here, so a bad grammar fails before anything runs).
        self.constraint = None if grammar is None else engine.compile_grammar(grammar).start()
        self.logprobs_top = logprobs
        self.logprobs: list[TokenLogprob] = []  # each token's, where asked
        self.stats = Stats(prompt_tokens=len(prompt))
        self.tokens: list[int] = []
        self.from_draft: list[bool] = []
        self.finish_reason: str | None = None
        self.notices: list[str] = []  # things the user should be told (e.g. old turns dropped)
        self.on_finish: Callable[[Generation], None] | None = None
        # Called as on_prefill(model, decoded, total) while a long prompt is read ("target" or "draft").
        self.on_prefill: Callable[[str, int, int], None] | None = None
        # The shared batch this stream may step in (`serve --parallel`): during its ticks a step verifies only the
        # drafts decoded for it in the tick's batch (core/slots.py, core/batchdraft.py), else decodes plainly.
        self.shared: SharedBatch | None = None
        self.pending = 0  # tokens of the current step not yet yielded (0: the next event starts a step)
        self._history: list[int] | None = None  # the prompt and the tokens so far, once the prompt is read
        self._chain: ChainLawBuilder | None = None  # llama.cpp's chain for the target's law, while it runs
        self._text = TextStream(stop)
        self._cancel = threading.Event()
        self._chunk = 0  # `read_prompt` waits between parts of this many tokens (0: it does not)
        self._started = False
        self._draft_unread = False  # the draft has not read the prompt: it reads it after the first token
        self._draft_read: DraftRead | None = None  # when and how much of the prompt the draft reads (set by `_run`)
        self._forced: list[int] | None = None  # the grammar's forced tokens for the next step, once worked out
        # `draft_own` asked this stream's policy for the next step's k (the step teaches it), and any drafts the tick
        # holds for it are its own drafter's (which keeps its cache after the step)
        self._chose = False
        self._draft_error: NonFiniteLogitsError | None = None  # what `draft_own` met, said by the step

    @property
    def text(self) -> str:
        return self._text.text

    def cancel(self) -> None:
        """Ask the generation to stop after the current step (thread-safe)."""
        self._cancel.set()

    def next_rows(self) -> list[int] | None:
        """The tokens a plain next step decodes at the target's n_past — the last one, then those the grammar forces
        (worked out once, here, and kept for the step) — where the next event starts a step; None while the prompt
        is unread, at the end, or when cancelled (`serve --parallel` decodes them ahead, in the shared batch)."""
        history = self._history
        if history is None or self.pending or self.finish_reason is not None or self._cancel.is_set():
            return None
        if len(history) > self.engine.n_ctx or self.target.n_past != len(history) - 1:
            return None
        return [history[-1], *self._forced_now(history)]

    @property
    def history(self) -> list[int]:
        """The prompt and the tokens so far (empty until the prompt is read); read it, never change it."""
        return self._history if self._history is not None else []

    def request(self, k: int, forced: Sequence[int] = ()) -> DraftRequest:
        """What this generation's next step asks of a drafter: k drafts after the history and the tokens a grammar
        `forced` (the one builder of a step's request, for a step alone and for the draft model drafting in a shared
        batch, core/slots.py)."""
        history = self.history
        return DraftRequest(
            history=[*history, *forced] if forced else history,
            k=k,
            sampling=self.sampling,
            pq=self.spec.verify != "match",
            p_min=self.spec.p_min,
            rng=self.rng,
            chain=self._chain,
            constraint=self.constraint,
            forced=len(forced),
            logprobs=self.logprobs_top,
        )

    @property
    def drafts_alone(self) -> bool:
        """Whether this stream chooses its own k and drafts with its own drafter in a shared batch too, rather than as
        the batch's plan says (`serve --parallel`): a seed at T > 0 (which streams the plan drafts for depends on the
        clock; the text must not) or a drafter the batch cannot draft with (another vocabulary: `Drafter.batched`)."""
        seeded = self.sampling.seed is not None and not self.sampling.greedy
        return seeded or not self.drafter.batched

    def draft_room(self) -> int:
        """Most drafts a step may verify after drafts decoded in a shared batch (`serve --parallel`, the plan's
        streams): after the tokens the grammar forces (`next_rows`), within the answer and the room; 0 where this
        generation does not speculate."""
        history = self._history
        if history is None:
            return 0
        forced = self._forced or []
        remaining = self.max_tokens - len(self.tokens) - len(forced)
        limit = self.engine.draft_limit(self.spec, remaining, len(history) + len(forced), self.drafter)
        return max(0, min(limit, self.target.room() - 1 - len(forced)))  # a shared pool's free cells

    def draft_own(self, *, alone: bool = False) -> Proposal | None:
        """This stream's drafts for its next step in a shared batch, drafted now by its own drafter with the k its own
        policy chooses, exactly as its step alone would (`drafts_alone`: a seeded or bridged stream; `alone`: the
        tick's only stream, which first lets its draft read the prompt where that pays, as a step alone does); None:
        none. The step then verifies them from the batch's rows and its drafter keeps its cache (`SharedDrafts`)."""
        history = self._history
        if history is None or self._forced is None:
            return None
        if alone and not self._catch_up_draft(history):
            return None  # cancelled while the draft read: its step ends it
        forced = self._forced
        self._chose = True
        k = self._draft_length(history, forced)
        if not k:
            return None
        t0 = time.perf_counter()
        try:
            drafts = self.drafter.propose(self.request(k, forced))
        except NonFiniteLogitsError as e:  # said by its step, as alone (`speculative_step` names the model)
            self._draft_error = e
            return None
        if self.constraint is not None:
            drafts = admitted(drafts, self.constraint, len(forced))
        drafts.cost = dataclasses.replace(drafts.cost, seconds_ahead=time.perf_counter() - t0)  # its step's draft time
        return drafts

    def read_prompt(self, chunk: int) -> Iterator[None]:
        """Read the prompt into the target's cache `chunk` tokens at a time before the generation runs, yielding after
        each chunk (`serve --parallel`: the other streams step between chunks, so a long prompt does not stall their
        answers). Iterating the generation afterwards reads the rest; a cancel stops between chunks."""
        target, prompt = self.target, self.prompt[:-1]
        t0, decoded, restored = time.perf_counter(), target.n_decoded, target.n_restored
        done = target.reuse(prompt)  # the prompt cache looked up with the whole prompt, not its first part
        self.stats.prefill_decoded += target.n_decoded - decoded
        self.stats.prefill_restored += target.n_restored - restored
        self.stats.seconds_prefill += time.perf_counter() - t0
        try:
            while (part := self._next_part(done, chunk)) and not self._cancel.is_set():
                t0 = time.perf_counter()
                target.append(part, outputs=0)  # rows a shared batch decoded for it are taken (`prompt_rows`)
                done += len(part)
                self.stats.prefill_decoded += len(part)
                self.stats.seconds_prefill += time.perf_counter() - t0
                self._chunk = chunk
                yield
        finally:
            self._chunk = 0

    def prompt_rows(self) -> list[int] | None:
        """The part of the prompt `read_prompt` reads when it resumes — where it waits between parts, and the part
        holds no image — for a shared batch to decode beside the other streams' rows (`serve --parallel`: one pass
        for all, no logits for them); None otherwise."""
        if not self._chunk or self._cancel.is_set():
            return None
        part = self._next_part(self.target.n_past, self._chunk)
        return part if part and min(part) >= 0 else None

    def _next_part(self, done: int, chunk: int) -> list[int]:
        """The part of the prompt `read_prompt` reads after its first `done` tokens (empty: what is left, at most
        `chunk`, is read when the generation starts)."""
        prompt = self.prompt[:-1]
        return prompt[done : whole_images(prompt, done + chunk)] if len(prompt) - done > chunk else []

    @property
    def caches(self) -> tuple[KVSequence, ...]:
        """The caches this generation keeps consistent: its target's, then the drafter's."""
        return (self.target, *self.drafter.caches)

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
            for seq in self.caches:  # a step cut short (Ctrl+C inside a decode or a rollback): roll it back
                seq.repair()
            raise
        finally:
            self.stats.seconds = time.perf_counter() - start
            self.finish_reason = self.finish_reason or "cancelled"
            for seq in self.caches:
                seq.check()
            if self.on_finish is not None:
                self.on_finish(self)

    def _run(self) -> Iterator[TokenEvent]:
        engine, stats, target = self.engine, self.stats, self.target
        stats.drafter = self.drafter.kind
        t0 = time.perf_counter()
        self.policy.start()
        if engine.threads is not None:
            engine.threads.start()
        try:
            restored = target.n_restored
            stats.prefill_decoded += target.sync(self.prompt[:-1], progress=self._prefill_progress("target"))
            stats.prefill_restored += target.n_restored - restored
            if stats.prefill_decoded:
                target.anchor()  # recurrent/hybrid memory: the next turn restores this, not a re-read
            self._draft_unread = self._draft_reads_later()
            if not self._draft_unread:
                self._read_draft(self.prompt)
        except PrefillStopped:  # Esc while reading a long prompt: the caches hold what was read so far
            yield self._finish(None, "cancelled")
            return
        finally:
            stats.seconds_prefill += time.perf_counter() - t0
        history = list(self.prompt)
        drafting = self.spec.draft_max > 0 and self.drafter.drafts
        self._chain = target_chain(target.ctx, self.sampling, self.rng, drafting=drafting)  # None: numpy's law
        self._history = history
        try:
            yield from self._steps(history)
        finally:
            if self._chain is not None:
                self._chain.close()
                self._chain = None

    def _draft_reads_later(self) -> bool:
        """Whether the draft reads the prompt after the first token, and then only once that pays (core/draftread.py:
        its window, and when; a draft head reads the target's rows as they are decoded: it has nothing of its own)."""
        drafter = self.drafter
        read = self._draft_read = DraftRead(drafter, self.policy, self.prompt)
        if drafter.after_target_decode is not None or not self._draft_wanted(self.prompt):
            return False
        return read.later(self)

    def _draft_wanted(self, history: list[int]) -> bool:
        # A prompt longer than a shorter draft context: no drafting (the room check keeps k at 0). Beside other streams
        # in a tick, the plan's drafts catch the draft up.
        fits = len(history) < self.drafter.n_ctx
        tick = self._tick()
        return fits and (tick is None or tick.alone(self)) and self.policy.wants_draft(self.spec.adaptive)

    def _catch_up_draft(self, history: list[int]) -> bool:
        """The draft reads what it has not of the prompt, once that pays (core/draftread.py `DraftRead.pays`); False:
        the generation was cancelled while it read."""
        read = self._draft_read
        if not (self._draft_unread and self.tokens and read is not None and read.pays(self)):
            return True
        self._draft_unread = False
        t0 = time.perf_counter()
        try:
            self._read_draft(history)
        except PrefillStopped:
            return False
        finally:
            self.stats.seconds_prefill += time.perf_counter() - t0
        return True

    def _read_draft(self, history: list[int]) -> None:
        """The drafter reads `history` (but its last token) to draft after it.

        Raises:
            PrefillStopped: the generation was cancelled while a long history was read.
        """
        if self._draft_read is not None and self._draft_wanted(history):
            self.stats.draft_prefill_decoded += self._draft_read.read(history, self._prefill_progress("draft"))

    def _forced_now(self, history: list[int]) -> list[int]:
        """The tokens the grammar forces at the next step, emitted without asking the model: worked out (and pushed)
        once a step, by the step or ahead of it by `next_rows`, and kept until the step takes them."""
        if self._forced is None:
            forced: list[int] = []
            if self.constraint is not None:
                room = min(self.max_tokens - len(self.tokens), self.target.room() - 1) - 1
                forced = self.constraint.forced(room, self.engine.eog)
            self._forced = forced
        return self._forced

    def _draft_length(self, history: list[int], forced: list[int]) -> int:
        """k for a step this stream's own policy decides (alone, or `draft_own`): none before the draft has read the
        prompt, none after forced tokens for a head that reads the target's rows (it has none for them yet)."""
        if self._draft_unread:  # before the draft has read the prompt: the first step, and an answer too short to pay
            if self.tokens:
                self.stats.speculation_off = "too few tokens to come to pay for the draft's read of the prompt"
            return 0
        if forced and self.drafter.after_target_decode is not None:
            return 0
        k = self.engine.draft_length(
            self.spec,
            self.max_tokens - len(self.tokens) - len(forced),
            len(history) + len(forced),
            self.stats,
            (self.drafter, self.policy),
            timed=self.sampling.seed is None,  # with a fixed seed, k must not depend on the clock: the text would too
        )
        return max(0, min(k, self.target.room() - 1 - len(forced)))  # a shared pool's free cells (--parallel)

    def _step_drafter(self, history: list[int], forced: list[int]) -> tuple[Drafter, int, bool]:
        """The drafter of the next step, its k, and whether this stream's own policy chose k: alone (no tick, or one
        that decoded nothing for it nor for any other stream: its first step), the stream's drafter; in a shared tick,
        the drafts decoded for it in the batch (its own, drafted ahead by `draft_own`, or the plan's) or none."""
        tick = self._tick()
        if tick is None or not self._chose and tick.alone(self):
            return self.drafter, self._draft_length(history, forced), True
        ahead = tick.drafts_for(self)
        chose, self._chose = self._chose, False
        if self._draft_error is not None:
            error, self._draft_error = self._draft_error, None
            raise error
        if ahead is None or not ahead.tokens:
            return self.drafter, 0, chose
        return SharedDrafts(ahead, self.drafter if chose else None), len(ahead.tokens), chose

    def _steps(self, history: list[int]) -> Iterator[TokenEvent]:
        engine, stats = self.engine, self.stats
        while True:
            reason = self._reason_to_stop(history)
            if reason:
                yield self._finish(None, reason)
                return
            if not self._catch_up_draft(history):
                yield self._finish(None, "cancelled")
                return
            forced = self._forced_now(history)
            drafter, k, chosen = self._step_drafter(history, forced)
            self._forced = None  # this step takes them
            if engine.threads is not None:
                engine.threads.check()
            try:
                step = speculative_step(self.target, drafter, self.request(k, forced))
            except NoRoomError as e:  # nothing decoded: the slots' shared pool had no cell left (`serve --parallel`)
                yield self._out_of_room(str(e))
                return
            for seq in self.caches:
                seq.check()
            stats.record_step(step)
            if chosen:  # the plan's drafts in a shared batch say nothing of this stream's policy
                self.policy.observe(step, timed=not self.target.ctx.row_shared)
            for i, (token, from_draft) in enumerate(step.tokens):
                self.pending = len(step.tokens) - i - 1
                if step.logprobs is not None:
                    self.logprobs.append(step.logprobs[i])
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

    def _tick(self) -> Tick | None:
        return self.shared.tick if self.shared is not None else None

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
        if self.target.room() < 1:  # the pool the slots of `serve --parallel` share has no free cell left
            self.notices.append(f"the answer was cut short: {self.target.ctx.full_message()}")
            return "length"
        return None

    def _out_of_room(self, why: str) -> TokenEvent:
        """The close of a generation whose step found no free cell (nothing decoded), the user told why."""
        for seq in self.caches:
            seq.repair()
        self.notices.append(f"the answer was cut short: {why}")
        return self._finish(None, "length")

    def _finish(self, token: int | None, reason: str, from_draft: bool = False, text: str = "") -> TokenEvent:
        self.finish_reason = reason
        if self._draft_read is not None and reason in ("stop", "length"):  # how long answers run (not a cancel)
            self._draft_read.finished(len(self.tokens), cut=reason == "length")
        if token is not None:
            # Tokens past the end of the step were counted as emitted; the user sees only these.
            self.stats.emitted = len(self.tokens)
        return TokenEvent(token, text + self._text.flush(), from_draft, reason)
