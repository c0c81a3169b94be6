"""Drafters propose the next k tokens, the law each was drawn from, and what drafting them cost.

`ModelDrafter` runs a small model that shares the target's vocabulary in its own context (a draft with another
vocabulary: core/bridge.py's `BridgedDrafter`; the target's own MTP head: core/head.py's `MtpDrafter`; a Gemma 4
assistant sidecar: core/assistant.py's `AssistantDrafter`).
`NgramDrafter` copies what followed the longest earlier match of the history's end (core/ngram.py's index over the
prompt and the output); it has no distribution, so it returns None as the law: the one-hot case of DESIGN §1.
`NgramFirst` wraps a model drafter: the n-gram's copy first, the model after it or, without a match, instead of it.
`NoDrafter` proposes nothing. `make_drafter` builds each kind of DRAFTERS from the built model drafter, or says why it
cannot. Every drafter states what it needs, owns and costs through the `Drafter` protocol and is asked with one
`DraftRequest`, so the loop, the policy and the engine never ask which class they hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from localspec.errors import InvalidParamsError

from .drafting import (
    WHOLE_ROWS_MAX,
    CostMeter,
    DraftCost,
    DraftLawBuilder,
    DraftRequest,
    Pick,
    Proposal,
    chain_law_builder,
    chain_law_fits,
    draft_loop,
    draft_token,
    draft_top_k,
    drive,
    drive_alone,
)
from .draftread import DraftReads
from .kv import KVSequence, Progress
from .laws import ArrayLaw
from .ngram import HistoryIndex
from .params import DRAFTERS
from .sampling import penalty_window

__all__ = [  # what callers found here before core/drafting.py took it, beside the drafters
    "WHOLE_ROWS_MAX",
    "DraftCost",
    "DraftLawBuilder",
    "DraftRequest",
    "Drafter",
    "ModelDrafter",
    "NgramDrafter",
    "NgramFirst",
    "NoDrafter",
    "Pick",
    "Proposal",
    "SharedDrafts",
    "chain_law_builder",
    "chain_law_fits",
    "draft_loop",
    "draft_token",
    "draft_top_k",
    "drive",
    "drive_alone",
    "make_drafter",
]


@runtime_checkable
class Drafter(Protocol):
    """What the generation loop, the policy and the `Engine` may ask of a drafter — and all they ask.

    Every drafter speaks this, "none" included (`NoDrafter` proposes nothing), so the loop has no branch for any
    kind. A drafter that reads the target (a model's own MTP head) is built with the target's sequence and follows
    each of its decodes through `after_target_decode`, which `Engine.use_drafter` installs; after each verify pass
    `keep(n)` tells it how much of the history is final, which is the row of that pass it continues.
    """

    @property
    def kind(self) -> str:
        """Its name in DRAFTERS."""

    @property
    def needs_model(self) -> bool:
        """Drafts with the draft model: `Engine.load` loads one and passes its cache."""

    @property
    def drafts(self) -> bool:
        """Proposes tokens at all (False: `NoDrafter`, plain decoding)."""

    @property
    def caches(self) -> tuple[KVSequence, ...]:
        """The caches it owns (the engine checks, repairs and times them); () for lookup."""

    @property
    def n_ctx(self) -> int:
        """The longest history it can draft after."""

    @property
    def size_ratio(self) -> float:
        """Its weights over the target's (0: no model): the policy's cost estimate without a clock."""

    @property
    def after_target_decode(self) -> Callable[[list[int], int], None] | None:
        """Told (tokens, n_past) after each target decode: a head that reads the target's rows; None for the others."""

    @property
    def batched(self) -> bool:
        """A shared batch may draft for its stream as its plan says (`serve --parallel`, core/slots.py): n-gram copies
        and the draft model drafting for several streams at once. False: the stream drafts with this drafter itself."""

    def describe(self) -> str:
        """What the user is told once about how it drafts ("" when there is nothing to say)."""
        ...

    def propose(self, request: DraftRequest) -> Proposal:
        """Draft up to `request.k` tokens after `request.history`, with what that cost."""
        ...

    def keep(self, n: int) -> None:
        """The first n tokens of the history are final; forget any drafted state past them."""
        ...

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        """Get ready to draft after `prompt`; returns the tokens decoded (0 for lookup drafters).

        Raises:
            PrefillStopped: `progress` asked to stop (see `KVSequence.append`).
        """
        ...


class NoDrafter:
    """`--drafter none`: proposes nothing, so every step is a plain target step."""

    kind = "none"
    needs_model = False
    drafts = False
    batched = True
    caches: tuple[KVSequence, ...] = ()
    n_ctx = 1 << 30
    size_ratio = 0.0
    after_target_decode = None

    def describe(self) -> str:
        return ""

    def propose(self, request: DraftRequest) -> Proposal:
        return Proposal()

    def keep(self, n: int) -> None:
        pass

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        return 0


class ModelDrafter:
    """Drafts with a small model. Its KV keeps the accepted prefix between steps.

    Args:
        seq: the draft model's sequence.
        size_ratio: the draft's weight bytes over the target's.
    """

    kind = "model"
    needs_model = True
    drafts = True
    batched = True  # a subclass with another vocabulary (core/bridge.py) is not
    after_target_decode = None

    def __init__(self, seq: KVSequence, *, size_ratio: float) -> None:
        self.seq = seq
        self.caches = (seq,)
        self.size_ratio = size_ratio
        self.meter = CostMeter(self.caches)
        self.laws = DraftLawBuilder()
        self.reads = DraftReads(seq)  # the window of the history it holds (core/draftread.py)

    def describe(self) -> str:
        return ""

    @property
    def n_ctx(self) -> int:
        """Longest history it drafts after: its context (maybe shorter than the target's) and what its window skips."""
        return self.seq.ctx.n_ctx + self.reads.window.skipped

    def propose(self, request: DraftRequest) -> Proposal:
        seq, sampling, p_min = self.seq, request.sampling, request.p_min
        sampled = request.pq and not sampling.greedy
        free = request.constraint is None  # a grammar masks the host's row: no token chosen in the graph
        device_law = seq.ctx.device_topk and sampled and not sampling.penalised and free
        if seq.ctx.device_greedy:  # the draft's law in the graph: top-k + temperature, or the greedy chain
            seq.ctx.device_law(draft_top_k(sampling) if device_law else 0, sampling.temperature)
        seq.sync(self.reads.view(request.history), outputs=1)
        if seq.needs_checkpoint(request.k, one_batch=False):  # drafted one by one
            seq.checkpoint()
        recent = penalty_window(request.history, sampling)
        device = seq.ctx.device_greedy and not sampling.penalised and p_min == 0 and free

        def pick(drafted: list[int]) -> Pick:
            if device_law:
                law = ArrayLaw.from_logits(*seq.ctx.sampled_candidates(-1))  # only k candidates left the graph
                return Pick(law.sample(request.rng), law, law.top()[1])
            if device and not sampled:
                return Pick(seq.ctx.sampled_token(-1), None)  # the argmax the graph took
            return draft_token(seq.ctx, self.laws, recent, drafted, request, sampled)

        loop = draft_loop(request.k, pick, p_min=p_min, constraint=request.constraint)
        out = drive_alone(loop, lambda token: seq.append([token], outputs=1))
        out.cost = self.meter.take()
        return out

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        # Like the target, hold all but the last token; the first `propose` decodes it with logits.
        try:
            decoded = self.seq.sync(self.reads.view(prompt[:-1]), progress=progress)
            if decoded:
                self.seq.anchor()  # a recurrent/hybrid draft restores this next turn (`KVSequence.anchor`)
            return decoded
        finally:
            self.meter.take()  # the prompt's cost is the prefill's, not the first proposal's

    def keep(self, n: int) -> None:
        # The draft never decoded its last proposal, so after a fully accepted step it lags the
        # target by that token (and the bonus token); the next `sync` decodes both. A rollback that
        # re-decodes (a restored checkpoint) is counted in the next proposal's cost.
        self.seq.rollback_to(min(self.reads.kept(n), self.seq.n_past))


class NgramDrafter:
    """`--drafter ngram`: what followed the longest earlier match of the history's end (any n-gram of the prompt or
    the output, core/ngram.py's `NgramIndex`), copied.

    No model, no distribution: verification sees a one-hot draft law, so p/q accepts x with probability target(x).

    Args:
        n_min: the shortest match it drafts after.
    """

    kind = "ngram"
    needs_model = False
    drafts = True
    batched = True
    caches: tuple[KVSequence, ...] = ()
    n_ctx = 1 << 30  # the index works on any history length
    size_ratio = 0.0
    after_target_decode = None

    def __init__(self, n_min: int = 2) -> None:
        self.n_min = n_min
        self.history = HistoryIndex()

    def propose(self, request: DraftRequest) -> Proposal:
        tokens, _ = self.history.follow(request.history).continuation(request.k, self.n_min)
        return Proposal(tokens, [None] * len(tokens))

    def describe(self) -> str:
        return ""

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        return 0

    def keep(self, n: int) -> None:
        self.history.keep(n)


class SharedDrafts(NgramDrafter):
    """The drafts decoded in a shared batch for one stream's step (`serve --parallel`, core/slots.py), proposed as they
    are with the law each was drawn from and what they cost: the stream's own n-gram copy (point laws), the draft
    model's drafting for several streams, or the stream's own drafter's, drafted before its step (`keeper`: that
    drafter, which keeps its cache after the step; else nothing to keep)."""

    def __init__(self, drafts: Proposal, keeper: Drafter | None = None) -> None:  # no index of its own
        self.proposal, self.keeper = drafts, keeper

    def propose(self, request: DraftRequest) -> Proposal:
        drafts = self.proposal
        return Proposal(drafts.tokens[: request.k], drafts.laws[: request.k], drafts.cost)

    def keep(self, n: int) -> None:
        if self.keeper is not None:
            self.keeper.keep(n)


class NgramFirst:
    """`--drafter model+ngram`: the n-gram's copy first (as `NgramDrafter`) where the history's end matched at least
    `trust` tokens earlier, and the wrapped model drafter (plain or bridged) for the rest of the k tokens after it —
    or for all k where there is no such match.

    Which tokens are copied depends only on the history, so each copied token is a point law, and each model token is
    drawn from the draft's law after the tokens before it (the copied ones included): verification stays exact.

    Args:
        inner: the draft model's drafter.
        trust: the shortest match whose copy goes ahead of the model.
        copy_max: most tokens copied (None: k); the model drafts the rest of k after them.
    """

    kind = "model+ngram"
    needs_model = True
    drafts = True
    after_target_decode = None

    def __init__(self, inner: Drafter, *, trust: int = 2, copy_max: int | None = None) -> None:
        self.inner, self.trust, self.copy_max = inner, trust, copy_max
        self.batched = inner.batched
        self.caches = inner.caches
        self.size_ratio = inner.size_ratio
        self.history = HistoryIndex()

    @property
    def n_ctx(self) -> int:
        return self.inner.n_ctx

    def describe(self) -> str:
        return self.inner.describe()

    def propose(self, request: DraftRequest) -> Proposal:
        k = request.k if self.copy_max is None else min(request.k, self.copy_max)
        copied, _ = self.history.follow(request.history).continuation(k, self.trust)
        if not copied:
            return self.inner.propose(request)
        out = Proposal(copied, [None] * len(copied))  # the model did not run: nothing spent
        if len(copied) < request.k:  # the model drafts after the copy, from its own law
            more = self.inner.propose(
                dataclasses.replace(request, history=[*request.history, *copied], k=request.k - len(copied))
            )
            out.tokens += more.tokens
            out.laws += more.laws
            out.cost = more.cost  # the model's own report: reading the copy, then drafting
        return out

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        return self.inner.prefill(prompt, progress=progress)

    def keep(self, n: int) -> None:
        self.inner.keep(n)
        self.history.keep(n)


def _itself(model: Drafter | None) -> Drafter:
    """The model drafter as it is (the kinds that are it, `make_drafter` having checked it is there)."""
    assert model is not None
    return model


# Each kind of DRAFTERS: the kind of model drafter it is built around (None: it drafts without one), and how.
BUILDERS: dict[str, tuple[str | None, Callable[[Drafter | None], Drafter]]] = {
    "model": ("model", _itself),
    "ngram": (None, lambda _: NgramDrafter()),
    "model+ngram": ("model", lambda model: NgramFirst(model)),
    "mtp": ("mtp", _itself),
    "assistant": ("assistant", _itself),
    "none": (None, lambda _: NoDrafter()),
}
_MODELS = {
    "model": "the draft model's drafter",
    "mtp": "the target's MTP head (`MtpDrafter`)",
    "assistant": "a Gemma 4 assistant (`AssistantDrafter`)",
}


def make_drafter(kind: str, model: Drafter | None = None) -> Drafter:
    """The drafter named by `kind` (one of DRAFTERS), built around `model` where it drafts with one.

    Args:
        kind: the drafter's name.
        model: the built model drafter: the draft model's ("model", "model+ngram": a `ModelDrafter`, or a
            `BridgedDrafter` for another vocabulary), the target's own head ("mtp": core/head.py's `MtpDrafter`,
            built with the target's sequence) or its assistant sidecar ("assistant": core/assistant.py's
            `AssistantDrafter`); None for "ngram" and "none".

    Raises:
        InvalidParamsError: an unknown kind, or a model that kind cannot draft with (one line saying why).
    """
    if kind not in BUILDERS:
        raise InvalidParamsError(f"unknown drafter {kind!r}: one of {', '.join(DRAFTERS)}")
    wanted, build = BUILDERS[kind]
    given = f"was given the drafter {model.kind!r}" if model is not None else "was given none"
    if wanted is None and model is not None:
        raise InvalidParamsError(f"the drafter {kind!r} drafts without a model and {given}")
    if wanted is not None and (model is None or model.kind != wanted):
        raise InvalidParamsError(f"the drafter {kind!r} drafts with {_MODELS[wanted]} and {given}")
    return build(model)
