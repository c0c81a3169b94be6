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
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np

from localspec.errors import InvalidParamsError
from localspec.llama.sampler import MAX_TOP_K, ChainLawBuilder, chain_law_available

from .draftread import DraftReads
from .grammar import Constraint, masked, masked_argmax
from .kv import Context, KVSequence, Progress
from .laws import ArrayLaw, Law, ListLaw
from .ngram import HistoryIndex
from .params import DRAFTERS
from .sampling import SamplingParams, greedy_token, penalty_window, sampling_law, top_probability


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftRequest:
    """What one step asks of a drafter: up to k tokens after `history`, drawn how."""

    history: list[int]  # the tokens so far (the prompt and what was emitted); the drafter must not change it
    k: int  # most tokens to draft
    sampling: SamplingParams  # the target's sampling settings (the draft samples with them at T > 0)
    pq: bool  # p/q verification: at T > 0 draw from the draft's law and say it (else draft greedily: exact match)
    p_min: float  # stop drafting when the draft's confidence falls below this
    rng: np.random.Generator
    chain: ChainLawBuilder | None = None  # the target's law builder where llama.cpp's chain builds it (`target_chain`)
    # The grammar's matcher for this generation (core/grammar.py: a `Grammar` compiled, then started): a drafter that
    # drafts under it masks its law and pushes each token (`Constraint.push`); the step pushes the others' and ends
    # one-hot drafts at the first token it forbids.
    constraint: Constraint | None = None
    forced: int = 0  # the last `forced` tokens of `history` were forced by the grammar: not yet decoded by the target
    logprobs: int | None = None  # each emitted token's log-probability and this many alternatives (None: none)


@dataclass(frozen=True, slots=True)
class DraftCost:
    """What a drafter spent on one proposal (and on keeping its cache since the one before it)."""

    decoded: int = 0  # tokens its model decoded: the drafts and any catch-up
    seconds_decode: float = 0.0  # of the drafting time, inside llama_decode (the rest is Python)
    seconds_bridging: float = 0.0  # of the drafting time, moving between two vocabularies (a bridged draft)


@dataclass(slots=True)
class Proposal:
    """Drafted tokens x_1..x_k, the law each was drawn from (None = one-hot at the token), and their cost."""

    tokens: list[int] = field(default_factory=list)
    laws: list[Law | None] = field(default_factory=list)
    cost: DraftCost = DraftCost()


class Decoding(Protocol):
    """A context a drafter decodes in without a `KVSequence` (a Gemma 4 assistant's): what its `CostMeter` reads."""

    decodes: int  # llama_decode calls so far (one row each)
    seconds_decoding: float  # time spent inside them


class CostMeter:
    """A drafter's own costs since it last reported them: what its caches decoded, what it decoded in `contexts`
    without a cache of its own (a Gemma 4 assistant's: one row a decode), and its bridging time."""

    def __init__(self, caches: tuple[KVSequence, ...], *, contexts: tuple[Decoding, ...] = ()) -> None:
        self.caches, self.contexts = caches, contexts
        self.seconds_bridging = 0.0  # added to by the drafter
        self._mark = self._now()

    def _now(self) -> tuple[int, float]:
        decoded = sum(seq.n_decoded for seq in self.caches) + sum(ctx.decodes for ctx in self.contexts)
        seconds = sum(seq.ctx.seconds_decoding for seq in self.caches) + sum(c.seconds_decoding for c in self.contexts)
        return decoded, seconds

    def take(self) -> DraftCost:
        """The costs since the last `take` (or since the meter was made), and start again from zero."""
        decoded, seconds = self._now()
        cost = DraftCost(decoded - self._mark[0], seconds - self._mark[1], self.seconds_bridging)
        self._mark, self.seconds_bridging = (decoded, seconds), 0.0
        return cost


@runtime_checkable
class Drafter(Protocol):
    """What the generation loop, the policy and the `Engine` may ask of a drafter — and all they ask.

    Every drafter speaks this, "none" included (`NoDrafter` proposes nothing), so the loop has no branch for any
    kind. A drafter that reads the target (a model's own MTP head) is built with the target's sequence and follows
    each of its decodes through `after_target_decode`, which `Engine.use_drafter` installs; after each verify pass
    `keep(n)` tells it how much of the history is final, which is the row of that pass it continues.
    """

    kind: str  # its name in DRAFTERS
    needs_model: ClassVar[bool]  # drafts with the draft model: `Engine.load` loads one and passes its cache
    drafts: ClassVar[bool]  # proposes tokens at all (False: `NoDrafter`, plain decoding)
    caches: tuple[KVSequence, ...]  # the caches it owns (the engine checks, repairs and times them); () for lookup
    n_ctx: int  # longest history it can draft after
    size_ratio: float  # its weights over the target's (0: no model): the policy's cost estimate without a clock
    # Told (tokens, n_past) after each target decode: a head that reads the target's rows; None for the others.
    after_target_decode: Callable[[list[int], int], None] | None

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


def chain_law_fits(ctx: Context, sampling: SamplingParams) -> bool:
    """Whether llama.cpp's chain builds `sampling`'s law on `ctx`'s rows (`ChainLawBuilder`, DESIGN §2): T > 0, top-k on
    (≤ MAX_TOP_K, below the vocabulary), no penalties (they look at each row's own history), a context that samples
    on the host. Elsewhere numpy builds it (`sampling_law`)."""
    return (
        not sampling.greedy
        and 0 < sampling.top_k <= MAX_TOP_K
        and sampling.top_k < ctx.n_vocab
        and not sampling.penalised
        and ctx.host_chains
        and chain_law_available()
    )


def chain_law_builder(sampling: SamplingParams, seed: int = 0) -> ChainLawBuilder:
    """The chain for `sampling`'s law (where `chain_law_fits`); `seed` seeds its own draws (`ChainLawBuilder.draw`)."""
    return ChainLawBuilder(
        temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p, seed=seed
    )


Key = TypeVar("Key", bound=Hashable)

# Vocabularies up to this: llama.cpp's chain reads a drafted or verified row whole faster than numpy cuts it (49k:
# 96–99 against 134–141 µs per verified row); at 128k numpy's cut is the cheaper (129–132 against 155–160 µs).
WHOLE_ROWS_MAX = 2**16


class DraftLawBuilder:
    """Builds the law a draft model samples its last row from at T > 0: llama.cpp's chain where it builds our law and
    the vocabulary is at most `WHOLE_ROWS_MAX` (cheaper than numpy right after a CPU decode at 49k tokens; at 128k
    and 262k its C loop over every token costs more than numpy's cut; docs/benchmarks.md "Where the target's law is
    built"), else numpy.
    The draw is always ours, from the request's `rng`, so q is exactly the law the token came from whichever builds
    it. Keeps one chain, for the settings last used."""

    def __init__(self) -> None:
        self._settings: tuple | None = None
        self._chain: ChainLawBuilder | None = None

    def __call__(self, ctx: Context, history: list[int], sampling: SamplingParams) -> ArrayLaw | ListLaw:
        settings = (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.penalised)
        if settings != self._settings:
            self.close()
            fits = chain_law_fits(ctx, sampling) and ctx.n_vocab <= WHOLE_ROWS_MAX
            self._settings, self._chain = settings, chain_law_builder(sampling) if fits else None
        if self._chain is not None:
            return ListLaw(*self._chain.law(ctx, -1))
        return sampling_law(ctx.logits(-1), history, sampling)

    def close(self) -> None:
        if self._chain is not None:
            self._chain.close()
        self._settings, self._chain = None, None


@dataclass(frozen=True, slots=True)
class Pick:
    """One token a draft model drafted, as the draft loop (`draft_loop`) takes it."""

    token: int  # the drafted token, as the target reads it
    law: Law | None  # the law it was drawn from (None: one-hot, a greedy draft)
    confidence: float = 1.0  # the draft's confidence, which `p_min` is held against
    fed: int | None = None  # what the draft decodes after it, where not `token` (a bridged draft's own id)


def draft_token(
    ctx: Context, laws: DraftLawBuilder, recent: list[int], drafted: list[int], request: DraftRequest, sampled: bool
) -> Pick:
    """The next drafted token from `ctx`'s last row, after `recent` (the penalty window) and the `drafted` tokens,
    with its law (None for a greedy draft, a one-hot) and the draft's confidence for p_min. Drawn from the law
    `laws` builds at T > 0 with p/q (`sampled`), else the greedy token."""
    sampling, constraint = request.sampling, request.constraint
    if sampled:
        law = laws(ctx, recent + drafted, sampling)
        if constraint is not None:  # drawn from the masked law, and that is the law verification is told
            law = masked(law, constraint.mask(), lambda: ctx.logits(-1), recent + drafted, sampling)
        return Pick(law.sample(request.rng), law, law.top()[1])
    logits = ctx.logits(-1)  # (n_vocab,) view, valid until the next decode
    window = recent + drafted if sampling.penalised else recent
    token = greedy_token(logits, window, sampling)
    if constraint is not None:
        token = masked_argmax(token, constraint.mask(), lambda: logits, window, sampling)
    return Pick(token, None, top_probability(logits) if request.p_min > 0 else 1.0)


DraftLoop = Generator[int, None, Proposal]


def draft_loop(
    k: int, pick: Callable[[list[int]], Pick | None], *, p_min: float = 0.0, constraint: Constraint | None = None
) -> DraftLoop:
    """The draft loop of every drafter that runs a model (a draft model, a bridged one, the target's MTP head, and
    the draft model drafting for several streams at once): up to k tokens, each `pick`ed from the row the previous
    one's decode left (`pick(drafted)`; None: the draft ends there), until the draft is unsure (its confidence
    under `p_min`) or the grammar ends (`constraint`). It yields each token the next one needs decoded and the driver
    (`drive`) decodes it before asking for more; it returns the proposal (its cost left to the drafter)."""
    out = Proposal()
    for i in range(k):
        chosen = pick(out.tokens)
        if chosen is None or chosen.confidence < p_min:
            break  # the draft ends, or is unsure
        if constraint is not None and not constraint.push(chosen.token):
            break  # past the grammar's end (nothing follows an end of generation)
        out.tokens.append(chosen.token)
        out.laws.append(chosen.law)
        if i < k - 1:
            yield chosen.token if chosen.fed is None else chosen.fed
    return out


def drive(loops: dict[Key, DraftLoop], decode: Callable[[list[tuple[Key, int]]], None]) -> dict[Key, Proposal]:
    """Run draft loops side by side: each round, every loop still drafting gives the token it needs decoded, and
    `decode` decodes them all (one batch where the loops share a context) before the next round. Returns each loop's
    proposal by its key."""
    out: dict[Key, Proposal] = {}
    going = list(loops.items())
    while going:
        fed = []
        for key, loop in going:
            try:
                fed.append((key, next(loop)))
            except StopIteration as end:
                out[key] = end.value
        if fed:
            decode(fed)
        going = [(key, loops[key]) for key, _ in fed]
    return out


def drive_alone(loop: DraftLoop, decode: Callable[[int], None]) -> Proposal:
    """Run one draft loop, `decode` decoding each token it yields."""
    return drive({0: loop}, lambda fed: decode(fed[0][1]))[0]


class NoDrafter:
    """`--drafter none`: proposes nothing, so every step is a plain target step."""

    kind = "none"
    needs_model = False
    drafts = False
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


DEVICE_TOP_K = 40  # candidates of the draft's in-graph law when the sampling settings have no top-k


def draft_top_k(sampling: SamplingParams) -> int:
    """How many candidates the draft's in-graph law keeps. Any law is exact for the draft as long as verification
    is told it (DESIGN §1): top-k and temperature, which llama.cpp samples in the graph, without top-p or min-p."""
    return sampling.top_k or DEVICE_TOP_K


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
    are with the law each was drawn from: the stream's own n-gram copy (point laws) or the draft model's, drafted before
    its step (so no index and no cache of its own, and nothing to keep)."""

    def __init__(self, drafts: Proposal) -> None:  # NgramDrafter.__init__ not called: it builds an index
        self.drafts = drafts

    def propose(self, request: DraftRequest) -> Proposal:
        return Proposal(self.drafts.tokens[: request.k], self.drafts.laws[: request.k])

    def keep(self, n: int) -> None:
        pass


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
