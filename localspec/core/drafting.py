"""What a drafter is asked and answers (`DraftRequest`, `Proposal`, `DraftCost`, `CostMeter`), and how a model's
draft draws its tokens: the draft's law (`DraftLawBuilder`, llama.cpp's chain where it fits), one token (`draft_token`),
the loop of up to k (`draft_loop`) and its drivers, alone or several streams side by side (`drive`). The drafters
themselves are core/drafters.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from localspec.llama.sampler import MAX_TOP_K, ChainLawBuilder, chain_law_available

from .grammar import Constraint, masked, masked_argmax
from .kv import Context, KVSequence
from .laws import ArrayLaw, Law, ListLaw
from .sampling import SamplingParams, greedy_token, sampling_law, top_probability


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
    seconds_ahead: float = 0.0  # drafted ahead of its step (a shared tick: `Generation.draft_own`): the wall seconds


@dataclass(slots=True)
class Proposal:
    """Drafted tokens x_1..x_k, the law each was drawn from (None = one-hot at the token), and their cost."""

    tokens: list[int] = field(default_factory=list)
    laws: list[Law | None] = field(default_factory=list)
    cost: DraftCost = DraftCost()


class Decoding(Protocol):
    """A context a drafter decodes in without a `KVSequence` (a Gemma 4 assistant's): what its `CostMeter` reads."""

    @property
    def decodes(self) -> int:
        """llama_decode calls so far (one row each)."""
        ...

    @property
    def seconds_decoding(self) -> float:
        """Time spent inside them."""
        ...


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


DEVICE_TOP_K = 40  # candidates of the draft's in-graph law when the sampling settings have no top-k


def draft_top_k(sampling: SamplingParams) -> int:
    """How many candidates the draft's in-graph law keeps. Any law is exact for the draft as long as verification
    is told it (DESIGN §1): top-k and temperature, which llama.cpp samples in the graph, without top-p or min-p."""
    return sampling.top_k or DEVICE_TOP_K
