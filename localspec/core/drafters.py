"""Drafters propose the next k tokens and the law each was drawn from.

`ModelDrafter` runs a small model that shares the target's vocabulary in its own context.
`NgramDrafter` (prompt lookup) copies what followed the latest earlier occurrence of the last few
tokens; it has no distribution, so it returns None as the law: the one-hot case of DESIGN §1.
`LookupModelDrafter` tries the lookup first and the model when the history has no match. A draft with
another vocabulary drafts through core/bridge.py, which `make_drafter` is handed.
Every drafter states what it needs and owns through the `Drafter` protocol (`needs_model`, `caches`), so
the engine never asks which class it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from .kv import KVSequence, Progress
from .params import DRAFTERS, MODEL_DRAFTERS
from .sampling import Dist, SamplingParams, greedy_token, penalty_window, sampling_dist, top_probability


@dataclass(slots=True)
class Proposal:
    """Drafted tokens x_1..x_k and the law each was drawn from (None = one-hot at the token)."""

    tokens: list[int] = field(default_factory=list)
    dists: list[Dist | None] = field(default_factory=list)


@runtime_checkable
class Drafter(Protocol):
    """What the generation loop, the policy and the `Engine` may ask of a drafter — and all they ask."""

    kind: str  # its name in DRAFTERS
    needs_model: ClassVar[bool]  # drafts with the draft model: `Engine.load` loads one and passes its cache
    caches: tuple[KVSequence, ...]  # the caches it owns (the engine checks, repairs and times them); () for lookup
    n_ctx: int  # longest history it can draft after
    n_decoded: int  # tokens its model has decoded so far (0 without a model): drafting and catch-up cost
    seconds_bridging: float  # time spent moving between two vocabularies so far (0 unless bridged)

    def propose(
        self,
        history: list[int],
        k: int,
        sampling: SamplingParams,
        *,
        sample: bool,
        p_min: float,
        rng: np.random.Generator,
    ) -> Proposal:
        """Draft up to k tokens after `history`; `sample` draws from the draft law (p/q verification)."""
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


class ModelDrafter:
    """Drafts with a small model. Its KV keeps the accepted prefix between steps."""

    kind = "model"
    needs_model = True
    seconds_bridging = 0.0

    def __init__(self, seq: KVSequence) -> None:
        self.seq = seq
        self.caches = (seq,)

    @property
    def n_ctx(self) -> int:
        """Most tokens the draft can hold (its context may be shorter than the target's)."""
        return self.seq.ctx.n_ctx

    @property
    def n_decoded(self) -> int:
        return self.seq.n_decoded

    def propose(
        self,
        history: list[int],
        k: int,
        sampling: SamplingParams,
        *,
        sample: bool,
        p_min: float,
        rng: np.random.Generator,
    ) -> Proposal:
        seq = self.seq
        sampled = sample and not sampling.greedy
        device_law = seq.ctx.device_topk and sampled and not sampling.penalised
        if seq.ctx.device_greedy:  # the draft's law in the graph: top-k + temperature, or the greedy chain
            seq.ctx.device_law(draft_top_k(sampling) if device_law else 0, sampling.temperature)
        seq.sync(history, outputs=1)
        if seq.needs_checkpoint:
            seq.checkpoint()
        out = Proposal()
        recent = penalty_window(history, sampling)
        device = seq.ctx.device_greedy and not sampling.penalised and p_min == 0
        for i in range(k):
            if device_law:
                dist = Dist.from_logits(*seq.ctx.sampled_candidates(-1))  # only k candidates left the graph
                token, confidence = dist.sample(rng), dist.top()[1]
            elif sampled:
                dist = sampling_dist(seq.ctx.logits(-1), recent + out.tokens, sampling)
                token, confidence = dist.sample(rng), dist.top()[1]
            elif device:
                dist, token, confidence = None, seq.ctx.sampled_token(-1), 1.0  # the argmax the graph took
            else:
                logits = seq.ctx.logits(-1)  # (n_vocab,) view, valid until the next draft decode
                dist = None  # greedy drafting draws from a one-hot law
                token = greedy_token(logits, recent + out.tokens if sampling.penalised else recent, sampling)
                confidence = top_probability(logits) if p_min > 0 else 1.0
            if confidence < p_min:
                break
            out.tokens.append(token)
            out.dists.append(dist)
            if i < k - 1:
                seq.append([token], outputs=1)
        return out

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        # Like the target, hold all but the last token; the first `propose` decodes it with logits.
        return self.seq.sync(prompt[:-1], progress=progress)

    def keep(self, n: int) -> None:
        # The draft never decoded its last proposal, so after a fully accepted step it lags the
        # target by that token (and the bonus token); the next `sync` decodes both.
        self.seq.rollback_to(min(n, self.seq.n_past))


DEVICE_TOP_K = 40  # candidates of the draft's in-graph law when the sampling settings have no top-k


def draft_top_k(sampling: SamplingParams) -> int:
    """How many candidates the draft's in-graph law keeps. Any law is exact for the draft as long as verification
    is told it (DESIGN §1): top-k and temperature, which llama.cpp samples in the graph, without top-p or min-p."""
    return sampling.top_k or DEVICE_TOP_K


class NgramDrafter:
    """Prompt lookup: propose what followed the latest earlier occurrence of the history's last n tokens.

    n goes from `n_max` down to `n_min`; the first n with a match wins. No model, no distribution:
    verification sees a one-hot draft law, so p/q accepts x with probability target(x).
    """

    kind = "ngram"
    needs_model = False
    caches: tuple[KVSequence, ...] = ()
    n_ctx = 1 << 30  # the lookup works on any history length
    n_decoded = 0
    seconds_bridging = 0.0

    def __init__(self, n_max: int = 3, n_min: int = 2) -> None:
        assert 1 <= n_min <= n_max
        self.n_max, self.n_min = n_max, n_min

    def propose(
        self,
        history: list[int],
        k: int,
        sampling: SamplingParams,
        *,
        sample: bool,
        p_min: float,
        rng: np.random.Generator,
    ) -> Proposal:
        tokens = lookup(history, k, n_max=self.n_max, n_min=self.n_min)
        return Proposal(tokens, [None] * len(tokens))

    def prefill(self, prompt: list[int], *, progress: Progress | None = None) -> int:
        return 0

    def keep(self, n: int) -> None:
        pass


def lookup(history: list[int], k: int, *, n_max: int, n_min: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix n-gram."""
    tokens = np.asarray(history, dtype=np.int64)  # (m,)
    m = len(tokens)
    for n in range(min(n_max, m - 1), n_min - 1, -1):
        # A match starts at i < m - n, so at least one token follows it; the suffix itself is excluded.
        hits = np.ones(m - n, dtype=bool)  # (m - n,) candidate starts
        for j in range(n):
            hits &= tokens[j : m - n + j] == tokens[m - n + j]
        starts = np.flatnonzero(hits)
        if starts.size:
            follow = int(starts[-1]) + n
            return tokens[follow : follow + k].tolist()
    return []


class LookupFirst:
    """Mixed into a model drafter: the n-gram lookup when the history has a match, the model otherwise.

    Which drafter runs depends only on the history, so each step's draft law is still the one its
    tokens were drawn from (one-hot for a lookup) and verification stays exact.
    """

    def __init__(self, *args, ngram: NgramDrafter | None = None) -> None:
        super().__init__(*args)  # the model drafter's own arguments
        self.ngram = ngram or NgramDrafter()

    def propose(
        self,
        history: list[int],
        k: int,
        sampling: SamplingParams,
        *,
        sample: bool,
        p_min: float,
        rng: np.random.Generator,
    ) -> Proposal:
        found = self.ngram.propose(history, k, sampling, sample=sample, p_min=p_min, rng=rng)
        if found.tokens:
            return found
        return super().propose(history, k, sampling, sample=sample, p_min=p_min, rng=rng)


class LookupModelDrafter(LookupFirst, ModelDrafter):
    """`--drafter model+ngram`: the n-gram lookup when the history has a match, the draft model otherwise."""

    kind = "model+ngram"


_CLASSES: dict[str, type[ModelDrafter] | type[NgramDrafter] | None] = {
    "model": ModelDrafter,
    "ngram": NgramDrafter,
    "model+ngram": LookupModelDrafter,
    "none": None,
}  # keyed by the names in params.DRAFTERS, which owns the vocabulary
assert tuple(_CLASSES) == DRAFTERS
assert tuple(k for k, cls in _CLASSES.items() if cls is not None and cls.needs_model) == MODEL_DRAFTERS


def needs_draft_model(kind: str) -> bool:
    """Whether the drafter named `kind` (one of DRAFTERS) drafts with a draft model."""
    return kind in MODEL_DRAFTERS


class Bridge(Protocol):
    """A way for a draft with another vocabulary to draft (core/bridge.py's `VocabBridge`)."""

    def make(self, kind: str, seq: KVSequence) -> Drafter:
        """The bridged drafter for a model drafter name."""
        ...


def make_drafter(kind: str, draft: KVSequence | None, bridge: Bridge | None = None) -> Drafter | None:
    """The drafter named by `kind` (one of DRAFTERS).

    Args:
        kind: the drafter's name.
        draft: the draft model's sequence when it needs one.
        bridge: how that draft drafts when its vocabulary is not the target's (None: it is the same).
    """
    assert kind in DRAFTERS and (draft is not None) == needs_draft_model(kind)
    cls = _CLASSES[kind]
    if cls is None:
        return None
    if not cls.needs_model:
        return cls()
    return bridge.make(kind, draft) if bridge is not None else cls(draft)
