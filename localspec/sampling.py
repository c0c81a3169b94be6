"""The sampling transform shared by the draft and the target (DESIGN §2).

logits → repetition/frequency/presence penalties → temperature → softmax → top-k → top-p → min-p →
renormalise. The result is a `Dist`: the exact law a token is drawn from, which speculative
verification needs for both models. Randomness comes only from an injected numpy Generator.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .errors import InvalidParamsError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How tokens are chosen. temperature 0 means greedy (argmax)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (math.isfinite(self.temperature) and self.temperature >= 0, "temperature must be ≥ 0 (0 = greedy)"),
            (self.top_k >= 0, "top-k must be ≥ 0 (0 = off)"),
            (0 < self.top_p <= 1, "top-p must be in (0, 1] (1 = off)"),
            (0 <= self.min_p <= 1, "min-p must be in [0, 1] (0 = off)"),
            (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0, "repeat penalty must be > 0 (1 = off)"),
            (self.repeat_last_n >= 0, "repeat-last-n must be ≥ 0"),
            (math.isfinite(self.frequency_penalty), "frequency penalty must be a number"),
            (math.isfinite(self.presence_penalty), "presence penalty must be a number"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidParamsError(f"invalid sampling setting: {message}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        return (self.repeat_penalty != 1.0 or self.frequency_penalty or self.presence_penalty) and self.repeat_last_n > 0


@dataclass(slots=True)
class Dist:
    """A sampling distribution over a sparse support, most probable token first."""

    ids: np.ndarray  # (m,) int64 token ids
    probs: np.ndarray  # (m,) float64, sums to 1

    @classmethod
    def one_hot(cls, token: int) -> Dist:
        return cls(np.array([token], dtype=np.int64), np.ones(1))

    def prob(self, token: int) -> float:
        """Probability of `token` (0 outside the support)."""
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def top(self) -> tuple[int, float]:
        """The most probable token and its probability."""
        return int(self.ids[0]), float(self.probs[0])

    def sample(self, rng: np.random.Generator) -> int:
        """Draw one token (inverse CDF: one uniform per draw)."""
        cdf = np.cumsum(self.probs)
        i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        return int(self.ids[min(i, len(self.ids) - 1)])

    def dense(self, n_vocab: int) -> np.ndarray:
        """The distribution as a dense float64 vector of shape (n_vocab,)."""
        out = np.zeros(n_vocab)
        out[self.ids] = self.probs
        return out

    @classmethod
    def from_weights(cls, ids: np.ndarray, weights: np.ndarray) -> Dist:
        """A `Dist` from non-negative weights on `ids` (zeros dropped, normalised here)."""
        keep = weights > 0
        ids, weights = ids[keep], weights[keep]
        order = np.argsort(-weights, kind="stable")
        return cls(ids[order].astype(np.int64), weights[order] / weights.sum())


def penalty_window(history: list[int], params: SamplingParams) -> list[int]:
    """The tail of `history` the penalties look at ([] when no penalty is on, so callers skip the copy)."""
    return history[-params.repeat_last_n :] if params.penalised else []


def apply_penalties(logits: np.ndarray, history: list[int], params: SamplingParams) -> np.ndarray:
    """Return a penalised copy of `logits` (llama.cpp's rules) over the last `repeat_last_n` tokens."""
    counts = Counter(history[-params.repeat_last_n :])
    out = np.array(logits, dtype=np.float32)
    ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
    n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    vals = out[ids]
    vals = np.where(vals > 0, vals / params.repeat_penalty, vals * params.repeat_penalty)
    out[ids] = vals - n * params.frequency_penalty - params.presence_penalty
    return out


def greedy_token(logits: np.ndarray, history: list[int], params: SamplingParams) -> int:
    """The argmax after penalties (temperature 0)."""
    if params.penalised and history:
        logits = apply_penalties(logits, history, params)
    return int(np.argmax(logits))


def sampling_dist(logits: np.ndarray, history: list[int], params: SamplingParams) -> Dist:
    """The final sampling distribution for one row of logits.

    Args:
        logits: (n_vocab,) raw logits (a view is fine; it is not modified).
        history: every token before this position (prompt + output, drafts accepted so far included).
        params: the shared transform settings; temperature 0 gives a one-hot at the argmax.

    Returns:
        The `Dist` a token at this position is drawn from.
    """
    if params.penalised and history:
        logits = apply_penalties(logits, history, params)
    if params.greedy:
        return Dist.one_hot(int(np.argmax(logits)))
    n_vocab = logits.shape[0]
    if 0 < params.top_k < n_vocab:
        ids = np.argpartition(logits, n_vocab - params.top_k)[n_vocab - params.top_k :]
    else:
        ids = np.arange(n_vocab)
    scaled = logits[ids].astype(np.float64) / params.temperature  # (m,)
    order = np.argsort(-scaled, kind="stable")
    ids, scaled = ids[order], scaled[order]
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    keep = len(probs)
    if params.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), params.top_p, side="left")) + 1)
    if params.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= params.min_p * probs[0])))
    probs = probs[:keep] / probs[:keep].sum()
    return Dist(ids[:keep].astype(np.int64), probs)


def top_probability(logits: np.ndarray) -> float:
    """Softmax probability of the argmax at temperature 1 (the draft's confidence, for p_min)."""
    m = float(np.max(logits))
    return 1.0 / float(np.sum(np.exp(logits - m, dtype=np.float64)))
