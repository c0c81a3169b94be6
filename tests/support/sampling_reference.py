"""The sampling transform as first written: full sorts, dense arrays — slow, and obviously right.

`localspec.core.sampling` computes the same law without sorting the vocabulary; the tests compare the two on
random logits (ties included), every parameter combination, penalties on and off. Ties are broken the way
the production code documents it: among equal values the lower token id comes first (top-k keeps it, top-p
counts it first).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from localspec.core.sampling import SamplingParams


def apply_penalties(logits: np.ndarray, history: list[int], params: SamplingParams) -> np.ndarray:
    """A penalised float32 copy of `logits` (llama.cpp's rules) over the last `repeat_last_n` tokens."""
    counts = Counter(history[-params.repeat_last_n :])
    out = np.array(logits, dtype=np.float32)
    ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
    n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    vals = out[ids]
    vals = np.where(vals > 0, vals / params.repeat_penalty, vals * params.repeat_penalty)
    out[ids] = vals - n * params.frequency_penalty - params.presence_penalty
    return out


def reference_greedy(logits: np.ndarray, history: list[int], params: SamplingParams) -> int:
    if params.penalised and history:
        logits = apply_penalties(logits, history, params)
    return int(np.argmax(logits))


def reference_law(logits: np.ndarray, history: list[int], params: SamplingParams) -> dict[int, float]:
    """{token: probability} of the final sampling distribution (a one-hot at the argmax when greedy)."""
    if params.penalised and history:
        logits = apply_penalties(logits, history, params)
    if params.greedy:
        return {int(np.argmax(logits)): 1.0}
    n_vocab = logits.shape[0]
    order = np.argsort(-logits, kind="stable")  # every token, best first, lower id first among equals
    if 0 < params.top_k < n_vocab:
        order = order[: params.top_k]
    scaled = logits[order].astype(np.float64) / params.temperature
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    keep = len(probs)
    if params.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), params.top_p, side="left")) + 1)
    if params.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= params.min_p * probs[0])))
    probs = probs[:keep] / probs[:keep].sum()
    return {int(t): float(p) for t, p in zip(order[:keep], probs)}


def reference_dense(logits: np.ndarray, history: list[int], params: SamplingParams) -> np.ndarray:
    """The law as a dense (n_vocab,) float64 vector."""
    out = np.zeros(logits.shape[0])
    for token, p in reference_law(logits, history, params).items():
        out[token] = p
    return out
