"""Drafters propose the next k tokens and the law each was drawn from.

`ModelDrafter` runs a small model that shares the target's vocabulary in its own context. A drafter
without a distribution (n-gram lookup) returns None as the law: the one-hot case of DESIGN §1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .kv import KVSequence
from .sampling import Dist, SamplingParams, greedy_token, sampling_dist, top_probability


@dataclass(slots=True)
class Proposal:
    """Drafted tokens x_1..x_k and the law each was drawn from (None = one-hot at the token)."""

    tokens: list[int] = field(default_factory=list)
    dists: list[Dist | None] = field(default_factory=list)


class Drafter(Protocol):
    kind: str
    n_ctx: int  # longest history it can draft after

    def propose(self, history: list[int], k: int, sampling: SamplingParams, *, sample: bool,
                p_min: float, rng: np.random.Generator) -> Proposal:
        """Draft up to k tokens after `history`; `sample` draws from the draft law (p/q verification)."""
        ...

    def keep(self, n: int) -> None:
        """The first n tokens of the history are final; forget any drafted state past them."""
        ...

    def prefill(self, prompt: list[int]) -> int:
        """Get ready to draft after `prompt`; returns the tokens decoded (0 for lookup drafters)."""
        ...


class ModelDrafter:
    """Drafts with a small model. Its KV keeps the accepted prefix between steps."""

    kind = "model"

    def __init__(self, seq: KVSequence) -> None:
        self.seq = seq

    @property
    def n_ctx(self) -> int:
        """Most tokens the draft can hold (its context may be shorter than the target's)."""
        return self.seq.ctx.n_ctx

    def propose(self, history: list[int], k: int, sampling: SamplingParams, *, sample: bool,
                p_min: float, rng: np.random.Generator) -> Proposal:
        seq = self.seq
        seq.sync(history, outputs=1)
        if seq.needs_checkpoint:
            seq.checkpoint()
        out = Proposal()
        recent = history[-sampling.repeat_last_n :] if sampling.penalised else []
        for i in range(k):
            logits = seq.ctx.logits(-1)  # (n_vocab,) view, valid until the next draft decode
            context = recent + out.tokens if recent else out.tokens
            if sample and not sampling.greedy:
                dist = sampling_dist(logits, context, sampling)
                token, confidence = dist.sample(rng), dist.top()[1]
            else:
                dist = None  # greedy drafting draws from a one-hot law
                token = greedy_token(logits, context, sampling)
                confidence = top_probability(logits) if p_min > 0 else 1.0
            if confidence < p_min:
                break
            out.tokens.append(token)
            out.dists.append(dist)
            if i < k - 1:
                seq.append([token], outputs=1)
        return out

    def prefill(self, prompt: list[int]) -> int:
        # Like the target, hold all but the last token; the first `propose` decodes it with logits.
        return self.seq.sync(prompt[:-1])

    def keep(self, n: int) -> None:
        # The draft never decoded its last proposal, so after a fully accepted step it lags the
        # target by that token (and the bonus token); the next `sync` decodes both.
        self.seq.rollback_to(min(n, self.seq.n_past))
