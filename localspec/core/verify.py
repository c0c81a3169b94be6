"""Accept/reject rules for drafted tokens: greedy, exact match, and Leviathan's p/q rule.

Each function takes the k drafted tokens and the target's k+1 laws (row i is the law of position i given every
earlier draft token) and returns (n_accepted, next_token): the caller emits `draft_tokens[:n_accepted] +
[next_token]`. Pure functions: no I/O, one injected RNG.

Glossary (the step's words, defined in one place as vLLM's rejection sampler does):
- target law, draft law: the laws (`Law`, core/laws.py) the target and the draft give position i after the same
  history. The draft law is the one x_i was really drawn from; None stands for a one-hot draft (a lookup, a greedy
  draft), whatever else the draft model believed.
- accepted: a drafted token x_i kept — with probability min(1, target(x_i) / draft(x_i)) under p/q, when it equals
  the target's argmax (greedy), or when it equals the target's own draw (exact match). The first rejection ends it.
- residual (vLLM's "recovered" distribution): norm(max(0, target − draft)), the mass the target has and the draft
  lacks; the token emitted at the first rejection is drawn from it, so every emitted token follows the target law.
- bonus token: when all k drafts are accepted, one more token from the target's row k+1 (the verify pass computed
  it anyway): every step emits at least one token of the target's own.
- verdict: (how many drafts were accepted, the token emitted after them: the recovered or the bonus token).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .laws import ArrayLaw, Law

Verdict = tuple[int, int]  # (number of draft tokens accepted, the token emitted after them)


def verify_greedy(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """Temperature 0: accept while the draft equals the target's argmax; emit the argmax after.

    `target_argmax` is indexed lazily, so later rows need not be computed after a mismatch.
    """
    for i, token in enumerate(draft_tokens):
        if token != target_argmax[i]:
            return i, target_argmax[i]
    return len(draft_tokens), target_argmax[len(draft_tokens)]


def verify_match(draft_tokens: Sequence[int], target_laws: Sequence[Law], rng: np.random.Generator) -> Verdict:
    """Exact-match verification: sample from the target, accept while it equals the draft.

    Lossless for any drafter (the emitted tokens are plain target samples), but at temperature > 0 it
    accepts with probability target(x) instead of min(1, target(x)/draft(x)).
    """
    for i, token in enumerate(draft_tokens):
        sampled = target_laws[i].sample(rng)
        if sampled != token:
            return i, sampled
    return len(draft_tokens), target_laws[len(draft_tokens)].sample(rng)


def verify_pq(
    draft_tokens: Sequence[int],
    draft_laws: Sequence[Law | None],
    target_laws: Sequence[Law],
    rng: np.random.Generator,
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    For i = 1..k accept x_i with probability min(1, target_i(x_i) / draft_i(x_i)). At the first
    rejection emit y ~ norm(max(0, target_i − draft_i)); if all k pass emit y ~ target_{k+1}. The
    emitted tokens are distributed exactly as the target alone would produce them.

    Args:
        draft_tokens: x_1..x_k.
        draft_laws: the law each x_i was drawn from; None means a one-hot draft (n-gram lookup).
        target_laws: k+1 target laws (lazily indexed).
        rng: the single source of randomness.
    """
    for i, token in enumerate(draft_tokens):
        target = target_laws[i]
        draft = draft_laws[i] or ArrayLaw.one_hot(token)
        # Step 1: the ratio test. r < target/draft accepts; draft(x) > 0 since x was drawn from it.
        if rng.random() * draft.prob(token) < target.prob(token):
            continue
        # Step 2: rejected — resample from the residual, the mass the target has and the draft lacks.
        return i, residual(target, draft).sample(rng)
    # Step 3: every draft token passed — one bonus token from the target's next row.
    return len(draft_tokens), target_laws[len(draft_tokens)].sample(rng)


def residual(target: Law, draft: Law) -> Law:
    """norm(max(0, target − draft)) over the union of supports; the target itself if that mass is ~0."""
    ids, target_probs, draft_probs = _aligned(target, draft)
    mass = target_probs - draft_probs
    np.maximum(mass, 0.0, out=mass)
    if mass.sum() <= 1e-12:
        return target
    keep = mass > 0
    return ArrayLaw(ids[keep], mass[keep] / mass[keep].sum())


def _aligned(a: Law, b: Law) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, a's probabilities, b's probabilities) on the union of the two (ascending) supports.

    The cost follows the supports, never the vocabulary: a support usually holds the other (a one-hot
    draft inside the target's candidates), and then no merge is needed.
    """
    if a.ids.shape == b.ids.shape and np.array_equal(a.ids, b.ids):
        return a.ids, a.probs, b.probs
    big, small = (a, b) if len(a.ids) >= len(b.ids) else (b, a)
    pos = np.searchsorted(big.ids, small.ids)
    inside = pos < len(big.ids)
    inside[inside] = big.ids[pos[inside]] == small.ids[inside]
    if inside.all():
        ids, on_big, on_small = big.ids, big.probs, np.zeros(len(big.ids))
        on_small[pos] = small.probs
    else:
        ids = np.union1d(big.ids, small.ids)
        on_big, on_small = np.zeros(len(ids)), np.zeros(len(ids))
        on_big[np.searchsorted(ids, big.ids)] = big.probs
        on_small[np.searchsorted(ids, small.ids)] = small.probs
    return (ids, on_big, on_small) if big is a else (ids, on_small, on_big)
