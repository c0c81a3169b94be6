"""T1 (DESIGN §6): the accept/reject kernels emit exactly the target's law, shown by statistics.

Each trial draws x ~ draft with its own generator (as a drafter would) and calls the production kernel
once; the histogram of the emitted token must match the target within 6σ per cell and pass a
chi-square test, and P(accept) must equal Σ min(target, draft). A kernel that resamples from the
target instead of the residual must fail the very same check: that negative control is a test too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from support.lawcheck import binomial_ok, broken_pq, check_law, chi2_sf

from localspec.core.laws import ArrayLaw
from localspec.core.verify import residual, verify_match, verify_pq

N_TRIALS = 200_000
N_EDGE = 30_000
VOCAB = 10


def law(weights: dict[int, float]) -> ArrayLaw:
    """An `ArrayLaw` from {token: weight}."""
    ids = np.array(list(weights), dtype=np.int64)
    return ArrayLaw.from_weights(ids, np.array(list(weights.values()), dtype=np.float64))


def dense(dist: ArrayLaw) -> np.ndarray:
    return dist.dense(VOCAB)  # (VOCAB,)


def run_trials(
    kernel: Callable, target: ArrayLaw, draft: ArrayLaw | None, n: int, seed: int, draft_token: int | None = None
) -> tuple[np.ndarray, int]:
    """Emitted-token histogram (VOCAB,) and number of accepted drafts over n one-token trials.

    `draft` None is the one-hot drafter (n-gram): every trial proposes `draft_token`.
    """
    draft_rng, kernel_rng = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
    if draft is None:
        drafted = np.full(n, draft_token)  # (n,)
    else:
        drafted = draft_rng.choice(draft.ids, size=n, p=draft.probs)  # (n,)
    bonus = target  # the row after x_1; only read when x_1 is accepted
    counts, accepted = np.zeros(VOCAB, dtype=np.int64), 0
    for x in drafted.tolist():
        n_accepted, token = kernel([x], [draft], [target, bonus], kernel_rng)
        emitted = x if n_accepted else token
        counts[emitted] += 1
        accepted += n_accepted
    return counts, accepted


def pq(tokens, draft_dists, target_dists, rng):
    return verify_pq(tokens, draft_dists, target_dists, rng)


def match(tokens, draft_dists, target_dists, rng):
    return verify_match(tokens, target_dists, rng)


def overlapping_pair() -> tuple[ArrayLaw, ArrayLaw]:
    """A target and a draft that share some tokens, differ on others, and each miss a few."""
    rng = np.random.default_rng(11)
    target = law(dict(zip(range(0, 8), rng.dirichlet(np.full(8, 0.8)))))
    draft = law(dict(zip(range(2, 10), rng.dirichlet(np.full(8, 0.8)))))
    return target, draft


def test_chi_square_tail_matches_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(124.342113404, 100) == pytest.approx(0.05, rel=1e-6)
    assert chi2_sf(10.0, 10) == pytest.approx(0.4404932851, rel=1e-8)


@pytest.mark.slow
def test_pq_emits_the_target_law_and_accepts_sum_min():
    target, draft = overlapping_pair()
    counts, accepted = run_trials(pq, target, draft, N_TRIALS, seed=1)
    verdict = check_law(counts, dense(target))
    assert verdict.ok, verdict
    p_accept = float(np.minimum(dense(target), dense(draft)).sum())
    assert 0.2 < p_accept < 0.8  # both paths (accept, residual) carry real mass
    assert binomial_ok(accepted, N_TRIALS, p_accept), (accepted / N_TRIALS, p_accept)


@pytest.mark.slow
def test_resampling_from_the_target_fails_the_same_check():
    """Negative control: the check has the power to see the residual replaced by the target."""
    target, draft = overlapping_pair()
    counts, accepted = run_trials(broken_pq, target, draft, N_TRIALS, seed=1)
    verdict = check_law(counts, dense(target))
    assert not verdict.ok, f"a broken kernel passed: {verdict}"
    assert verdict.p_value < 1e-30 and verdict.worst_sigma > 20
    # It accepts exactly like the real kernel: only the rejection path is wrong, and the check sees it.
    assert binomial_ok(accepted, N_TRIALS, float(np.minimum(dense(target), dense(draft)).sum()))


def test_match_emits_the_target_law_and_accepts_sum_product():
    target, draft = overlapping_pair()
    counts, accepted = run_trials(match, target, draft, N_TRIALS // 2, seed=2)
    verdict = check_law(counts, dense(target))
    assert verdict.ok, verdict
    assert binomial_ok(accepted, N_TRIALS // 2, float((dense(target) * dense(draft)).sum()))


def test_equal_laws_always_accept():
    target, _ = overlapping_pair()
    counts, accepted = run_trials(pq, target, target, N_EDGE, seed=3)
    assert accepted == N_EDGE
    assert check_law(counts, dense(target)).ok


def test_disjoint_supports_never_accept_and_still_emit_the_target():
    target = law({0: 0.5, 1: 0.3, 2: 0.2})
    draft = law({5: 0.6, 6: 0.4})
    counts, accepted = run_trials(pq, target, draft, N_EDGE, seed=4)
    assert accepted == 0
    verdict = check_law(counts, dense(target))
    assert verdict.ok, verdict


@pytest.mark.slow
@pytest.mark.parametrize("token", [0, 3, 9])
def test_one_hot_draft_accepts_with_the_target_probability(token):
    """The n-gram case: no draft law (None), accept x with target(x), else the target without x."""
    target = law({0: 0.45, 1: 0.25, 2: 0.15, 3: 0.1, 4: 0.05})
    counts, accepted = run_trials(pq, target, None, N_EDGE, seed=5 + token, draft_token=token)
    verdict = check_law(counts, dense(target))
    assert verdict.ok, verdict
    assert binomial_ok(accepted, N_EDGE, target.prob(token)), (accepted / N_EDGE, target.prob(token))


def test_zero_target_mass_on_a_drafted_token_is_never_accepted():
    target = law({0: 0.5, 1: 0.3, 2: 0.2})
    draft = law({0: 0.2, 1: 0.2, 7: 0.6})  # token 7 is impossible for the target
    draft_rng, kernel_rng = np.random.default_rng(6), np.random.default_rng(7)
    counts = np.zeros(VOCAB, dtype=np.int64)
    for x in draft_rng.choice(draft.ids, size=N_EDGE, p=draft.probs).tolist():
        n_accepted, token = verify_pq([x], [draft], [target, target], kernel_rng)
        assert not (x == 7 and n_accepted)
        counts[x if n_accepted else token] += 1
    verdict = check_law(counts, dense(target))
    assert verdict.ok, verdict


def test_residual_is_the_normalised_positive_part():
    target, draft = overlapping_pair()
    want = np.maximum(dense(target) - dense(draft), 0)  # (VOCAB,)
    np.testing.assert_allclose(dense(residual(target, draft)), want / want.sum(), atol=1e-12)
    assert residual(target, target) is target  # no mass left: fall back to the target


def test_same_seed_same_verdicts():
    target, draft = overlapping_pair()
    a = run_trials(pq, target, draft, 2000, seed=9)
    b = run_trials(pq, target, draft, 2000, seed=9)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
