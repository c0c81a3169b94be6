"""Statistics for the exactness tests (DESIGN §6), in plain numpy and `math` (scipy is not a dependency).

`check_law(counts, probs)` is the one verdict every law test uses: each cell within 6σ of its expected
count AND a chi-square goodness-of-fit p-value above `P_MIN`, both over the same bins (cells expecting < 5
pooled into one: the normal approximation behind a σ does not hold for a cell expecting 0.08 — two hits there
are a 0.3 % event, not a 6.6σ one). A token the law gives probability 0 fails at once. The chi-square tail is
the regularized upper incomplete gamma.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from localspec.core.laws import ArrayLaw

P_MIN = 1e-4  # chi-square p-value below which a law is rejected (seeded tests: no flakiness, only margin)
MAX_SIGMA = 6.0


def gamma_q(a: float, x: float) -> float:
    """Q(a, x) = Γ(a, x) / Γ(a): series below a + 1, Lentz continued fraction above (Numerical Recipes 6.2)."""
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def chi2_sf(x: float, df: int) -> float:
    """P(χ²_df ≥ x)."""
    return gamma_q(df / 2, x / 2)


@dataclass(frozen=True)
class LawCheck:
    """The verdict of comparing observed counts with an exact law."""

    n: int
    chi2: float
    df: int
    p_value: float
    worst_sigma: float  # largest |count − n·p| / sqrt(n·p·(1 − p)) over the cells
    tv: float  # total-variation distance between the empirical and the exact law

    @property
    def ok(self) -> bool:
        return self.p_value >= P_MIN and self.worst_sigma <= MAX_SIGMA

    def __str__(self) -> str:
        return (
            f"n={self.n} chi2={self.chi2:.1f} df={self.df} p={self.p_value:.3g} "
            f"worst={self.worst_sigma:.1f}σ tv={self.tv:.4f}"
        )


def check_law(counts, probs) -> LawCheck:
    """Compare `counts` (observations per outcome) with the exact law `probs` (same length, sums to 1)."""
    counts = np.asarray(counts, dtype=np.float64).ravel()  # (m,)
    probs = np.asarray(probs, dtype=np.float64).ravel()  # (m,)
    assert counts.shape == probs.shape and abs(probs.sum() - 1) < 1e-9
    n = int(counts.sum())
    expected = n * probs  # (m,)
    tv = 0.5 * float(np.abs(counts / n - probs).sum())
    if np.any(counts[probs == 0] > 0):
        return LawCheck(n, math.inf, 0, 0.0, math.inf, tv)
    live = probs > 0
    big = expected >= 5
    small = ~big & live
    observed_bins = np.array(list(counts[big]) + ([counts[small].sum()] if np.any(small) else []))
    expected_bins = np.array(list(expected[big]) + ([expected[small].sum()] if np.any(small) else []))
    bin_probs = expected_bins / n
    sigma = np.sqrt(expected_bins * (1 - bin_probs))
    worst = float(np.max(np.abs(observed_bins - expected_bins) / np.maximum(sigma, 1e-12)))
    chi2 = float(np.sum((observed_bins - expected_bins) ** 2 / expected_bins))
    df = len(observed_bins) - 1
    return LawCheck(n, chi2, df, chi2_sf(chi2, df) if df > 0 else 1.0, worst, tv)


def law_of_runs(runs: list[dict], reference) -> LawCheck:
    """`check_law` of `generate --json` runs' first three tokens against `reference` (its `outcomes` and `probs`): an
    outcome the reference calls impossible counts in a last cell of probability 0."""
    index = {outcome: i for i, outcome in enumerate(reference.outcomes)}
    counts = np.zeros(len(index) + 1, dtype=np.int64)
    for run in runs:
        counts[index.get(tuple(run["tokens"][:3]), len(index))] += 1
    return check_law(counts, np.append(reference.probs, 0.0))


def drafted_accepted(runs: list[dict]) -> tuple[int, int]:
    """The draft tokens proposed and accepted over `generate --json` runs."""
    return sum(r["stats"]["drafted"] for r in runs), sum(r["stats"]["accepted"] for r in runs)


def binomial_ok(successes: int, n: int, p: float) -> bool:
    """`successes` of `n` trials within 6σ of a Binomial(n, p) mean."""
    return abs(successes - n * p) <= MAX_SIGMA * math.sqrt(max(n * p * (1 - p), 1e-12)) + 1e-9


def expected_tv(probs, n: int) -> float:
    """E[TV] between an n-sample empirical law and `probs` itself (normal approximation per cell)."""
    probs = np.asarray(probs, dtype=np.float64)
    return 0.5 * float(np.sum(np.sqrt(2 * probs * (1 - probs) / (math.pi * n))))


def broken_pq(draft_tokens, draft_dists, target_dists, rng):
    """verify_pq with the classic mistake: on rejection, resample from the target, not the residual."""
    for i, token in enumerate(draft_tokens):
        target, draft = target_dists[i], draft_dists[i] or ArrayLaw.one_hot(token)
        if rng.random() * draft.prob(token) < target.prob(token):
            continue
        return i, target.sample(rng)
    return len(draft_tokens), target_dists[len(draft_tokens)].sample(rng)
