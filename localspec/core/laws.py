"""Laws: what a token is drawn from, and what verification reads (DESIGN §1, §2).

A law is a distribution over a sparse support of token ids. Every row type speaks the `Law` protocol, so
verification (core/verify.py) never asks which one it holds: `ArrayLaw` (numpy arrays: what numpy's transform
builds, `sampling.sampling_law`), `ListLaw` (a few tokens as Python sequences: what llama.cpp's chain hands over,
`ChainLawBuilder.law`) and `ChainRowLaw` (a verified row whose draw is the chain's own native call, its law rebuilt
only when asked). A draft law of None is the one-hot law at the drafted token (a lookup, a greedy draft).
A grammar will restrict a law to the tokens it allows, renormalised (`Law.restricted`): rejection sampling against the
target's restricted law emits exactly that law whatever the draft proposed, and the draft's law restricted by the same
mask keeps its proposals valid, as long as it is the law its tokens were drawn from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from localspec.errors import NonFiniteLogitsError

if TYPE_CHECKING:
    from localspec.llama.sampler import ChainLawBuilder

    from .kv import Context


@runtime_checkable
class Law(Protocol):
    """A distribution over token ids: what a token is drawn from, and what verification reads.

    `ArrayLaw`, `ListLaw` and `ChainRowLaw` speak it (checked by tests; nothing on the hot path asks isinstance).
    """

    @property
    def ids(self) -> np.ndarray:
        """(m,) int64 token ids of the support, ascending, unique."""
        ...

    @property
    def probs(self) -> np.ndarray:
        """(m,) float64 probabilities of `ids`, summing to 1."""
        ...

    def prob(self, token: int) -> float:
        """Probability of `token` (0 outside the support)."""
        ...

    def top(self) -> tuple[int, float]:
        """The most probable token (the lower id among equals) and its probability."""
        ...

    def sample(self, rng: np.random.Generator) -> int:
        """Draw one token."""
        ...

    def dense(self, n_vocab: int) -> np.ndarray:
        """The law as a dense float64 vector of shape (n_vocab,)."""
        ...

    def restricted(self, allowed: np.ndarray) -> ArrayLaw | None:
        """The law restricted to the tokens `allowed` marks, renormalised: where a grammar hooks in. `allowed` is a
        (n_vocab,) bool mask; None when no allowed token has any probability."""
        ...


_SMALL = 64  # a support this small is walked in Python floats: fewer numpy calls, each costly right after a decode


@dataclass(slots=True)
class ArrayLaw:
    """A law kept as numpy arrays: token ids in ascending order and their probabilities."""

    ids: np.ndarray  # (m,) int64, ascending, unique
    probs: np.ndarray  # (m,) float64, sums to 1

    @classmethod
    def one_hot(cls, token: int) -> ArrayLaw:
        return cls(np.array([token], dtype=np.int64), np.ones(1))

    def prob(self, token: int) -> float:
        """Probability of `token` (0 outside the support)."""
        i = int(np.searchsorted(self.ids, token))
        return float(self.probs[i]) if i < len(self.ids) and self.ids[i] == token else 0.0

    def top(self) -> tuple[int, float]:
        """The most probable token (the lower id among equals) and its probability."""
        if len(self.probs) <= _SMALL:
            probs = self.probs.tolist()
            best = max(probs)
            return int(self.ids[probs.index(best)]), best
        i = int(np.argmax(self.probs))
        return int(self.ids[i]), float(self.probs[i])

    def sample(self, rng: np.random.Generator) -> int:
        """Draw one token (inverse CDF: one uniform per draw)."""
        u = rng.random()
        if len(self.probs) <= _SMALL:  # the running sum in Python floats: the same sums, the same token
            return int(self.ids[_draw(self.probs.tolist(), u)])
        cdf = np.cumsum(self.probs)
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return int(self.ids[min(i, len(self.ids) - 1)])

    def dense(self, n_vocab: int) -> np.ndarray:
        """The law as a dense float64 vector of shape (n_vocab,)."""
        out = np.zeros(n_vocab)
        out[self.ids] = self.probs
        return out

    def restricted(self, allowed: np.ndarray) -> ArrayLaw | None:
        """The law on the tokens `allowed` marks ((n_vocab,) bool), renormalised; None when they have no mass."""
        keep = allowed[self.ids]
        probs = self.probs[keep]
        total = probs.sum()
        return ArrayLaw(self.ids[keep], probs / total) if total > 0 else None

    @classmethod
    def from_logits(cls, ids: np.ndarray, logits: np.ndarray) -> ArrayLaw:
        """The softmax of `logits` (already divided by the temperature) over distinct `ids`, in float64."""
        best = np.max(logits)
        if not math.isfinite(best):  # numpy's max propagates NaN: one value already computed says it
            raise NonFiniteLogitsError()
        return cls.from_weights(ids, np.exp(np.asarray(logits, dtype=np.float64) - best))

    @classmethod
    def from_weights(cls, ids: np.ndarray, weights: np.ndarray) -> ArrayLaw:
        """A law from non-negative weights on distinct `ids` (zeros dropped, normalised here)."""
        keep = weights > 0
        ids, weights = np.asarray(ids, dtype=np.int64)[keep], np.asarray(weights, dtype=np.float64)[keep]
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], weights[order] / weights.sum())


class ListLaw:
    """A law over a few tokens kept as Python sequences, in the order they come (llama.cpp's chain hands them over best
    first, `ChainLawBuilder.law`): probabilities, the top token and draws in Python floats, and numpy arrays (ascending
    ids, as `ArrayLaw` keeps them) only when `ids`/`probs` are asked for (a residual)."""

    __slots__ = ("_ids", "_probs", "_arrays")

    def __init__(self, ids: Sequence[int], probs: Sequence[float]) -> None:
        self._ids, self._probs = ids, probs  # distinct ids, their probabilities (summing to 1)
        self._arrays: ArrayLaw | None = None

    @property
    def arrays(self) -> ArrayLaw:
        """The same law as numpy arrays (made once)."""
        if self._arrays is None:
            ids = np.array(self._ids, dtype=np.int64)
            order = np.argsort(ids)
            self._arrays = ArrayLaw(ids[order], np.array(self._probs)[order])
        return self._arrays

    @property
    def ids(self) -> np.ndarray:
        return self.arrays.ids

    @property
    def probs(self) -> np.ndarray:
        return self.arrays.probs

    def prob(self, token: int) -> float:
        return self._probs[self._ids.index(token)] if token in self._ids else 0.0

    def top(self) -> tuple[int, float]:
        best = max(self._probs)
        return self._ids[self._probs.index(best)], best

    def sample(self, rng: np.random.Generator) -> int:
        return self._ids[_draw(self._probs, rng.random())]

    def dense(self, n_vocab: int) -> np.ndarray:
        return self.arrays.dense(n_vocab)

    def restricted(self, allowed: np.ndarray) -> ArrayLaw | None:
        return self.arrays.restricted(allowed)


class ChainRowLaw:
    """Row i's law as llama.cpp's chain builds it. `sample` is the chain's own draw (its `dist` sampler and random
    state, not `rng`); the law itself is rebuilt from the chain's survivors only when p/q asks for a probability — the
    same law the draw uses (`ChainLawBuilder.law`). Valid until the context's next decode."""

    __slots__ = ("_chain", "_ctx", "_i", "_law")

    def __init__(self, chain: ChainLawBuilder, ctx: Context, i: int) -> None:
        self._chain, self._ctx, self._i = chain, ctx, i
        self._law: ListLaw | None = None

    @property
    def law(self) -> ListLaw:
        if self._law is None:
            self._law = ListLaw(*self._chain.law(self._ctx, self._i))
        return self._law

    @property
    def ids(self) -> np.ndarray:
        return self.law.ids

    @property
    def probs(self) -> np.ndarray:
        return self.law.probs

    def prob(self, token: int) -> float:
        return self.law.prob(token)

    def top(self) -> tuple[int, float]:
        return self.law.top()

    def dense(self, n_vocab: int) -> np.ndarray:
        return self.law.dense(n_vocab)

    def restricted(self, allowed: np.ndarray) -> ArrayLaw | None:
        return self.law.restricted(allowed)

    def sample(self, rng: np.random.Generator) -> int:
        return self._chain.draw(self._ctx, self._i)


def _draw(probs: list[float], u: float) -> int:
    """Inverse CDF in Python floats: the index whose running sum first passes u × the total."""
    cdf = list(accumulate(probs))
    reach = u * cdf[-1]
    return next((i for i, c in enumerate(cdf) if c > reach), len(cdf) - 1)
