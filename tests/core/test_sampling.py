"""The vocabulary-size-independent sampling path computes exactly the law of the full-sort reference.

`localspec.core.sampling` never sorts the vocabulary (block maxima, candidate sets, float64 only on survivors);
tests/support/sampling_reference.py sorts everything. On random logits — quantised so that ties are common, with
rows whose length is not a multiple of the block size — every parameter combination, penalties on and off
(also penalties that raise a logit), the two must give the same support and probabilities equal within
1e-9 relative. The residual and probability lookups are checked against dense arithmetic.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support.sampling_reference import reference_greedy, reference_law

from localspec.core.laws import ArrayLaw
from localspec.core.sampling import SamplingParams, greedy_token, sampling_law
from localspec.core.verify import residual

TEMPERATURES = (0.0, 0.3, 0.8, 1.5)
TOP_PS = (1.0, 0.9, 0.5)
MIN_PS = (0.0, 0.05, 0.3)
PENALTIES = {
    "off": {},
    "repeat": {"repeat_penalty": 1.3, "repeat_last_n": 16},
    "all": {"repeat_penalty": 1.2, "frequency_penalty": 0.3, "presence_penalty": 0.2, "repeat_last_n": 64},
    "raise": {"repeat_penalty": 0.7, "presence_penalty": -0.8, "repeat_last_n": 8},  # history tokens go UP
    "strong": {"repeat_penalty": 3.0, "frequency_penalty": 4.0, "repeat_last_n": 64},  # the best tokens sink
}


def random_row(rng: np.random.Generator, n_vocab: int, *, ties: bool) -> np.ndarray:
    row = rng.standard_normal(n_vocab) * 3.0
    if ties:
        row = np.round(row * 2) / 2  # a coarse grid: many equal values, also at every cut
    return row.astype(np.float32)


def history_for(rng: np.random.Generator, row: np.ndarray) -> list[int]:
    """A history mixing the row's best tokens (so penalties move the cut) and random ones."""
    best = np.argsort(-row, kind="stable")[:6].tolist()
    return best + rng.integers(0, row.shape[0], size=20).tolist() + best[:3]


def assert_same_law(got: ArrayLaw, want: dict[int, float]) -> None:
    assert got.ids.tolist() == sorted(want), "supports differ"
    assert np.all(np.diff(got.ids) > 0), "ids must be ascending"
    expected = np.array([want[t] for t in got.ids.tolist()])
    np.testing.assert_allclose(got.probs, expected, rtol=1e-9, atol=0)


@pytest.mark.parametrize("n_vocab", [7, 300, 3 * 1024 + 17, 4096])
@pytest.mark.parametrize("penalty", list(PENALTIES))
@pytest.mark.slow
def test_same_law_as_the_full_sort(n_vocab: int, penalty: str) -> None:
    rng = np.random.default_rng([n_vocab, len(penalty)])
    top_ks = sorted({0, 1, 5, 40, n_vocab - 1, n_vocab, n_vocab + 5} - {-1})
    checked = 0
    for trial in range(3):
        row = random_row(rng, n_vocab, ties=trial != 2)
        history = history_for(rng, row)
        for t, k, p, m in itertools.product(TEMPERATURES, top_ks, TOP_PS, MIN_PS):
            params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m, **PENALTIES[penalty])
            assert_same_law(sampling_law(row, history, params), reference_law(row, history, params))
            checked += 1
        greedy = SamplingParams(temperature=0, **PENALTIES[penalty])
        assert greedy_token(row, history, greedy) == reference_greedy(row, history, greedy)
    assert checked == 3 * len(TEMPERATURES) * len(top_ks) * len(TOP_PS) * len(MIN_PS)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=0.8, top_k=0, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=0.8, top_k=0, top_p=0.9, min_p=0.0),
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),  # every filter off: one softmax
        SamplingParams(temperature=0.7, top_k=0, top_p=0.999, min_p=0.0, repeat_penalty=1.1),
        SamplingParams(temperature=1.2, top_k=2000, top_p=0.95, min_p=0.0, repeat_penalty=1.1),
    ],
    ids=["default", "topk0-minp", "topk0-topp", "all-off", "topk0-wide-topp-penalty", "topk2000"],
)
def test_same_law_at_a_real_vocabulary(params: SamplingParams) -> None:
    """262,144 tokens (Gemma 3): 4,096 column maxima; a flat row makes top-p reach far."""
    rng = np.random.default_rng(7)
    for row in (random_row(rng, 262_144, ties=False), (rng.standard_normal(262_144) * 0.5).astype(np.float32)):
        history = history_for(rng, row)
        assert_same_law(sampling_law(row, history, params), reference_law(row, history, params))


def test_dist_lookups_and_residual_match_dense_arithmetic() -> None:
    rng = np.random.default_rng(3)
    n_vocab = 50
    for _ in range(200):
        t_ids = rng.choice(n_vocab, size=int(rng.integers(1, 20)), replace=False)
        d_ids = rng.choice(n_vocab, size=int(rng.integers(1, 20)), replace=False)
        target = ArrayLaw.from_weights(t_ids, rng.random(len(t_ids)) + 1e-3)
        draft = ArrayLaw.from_weights(d_ids, rng.random(len(d_ids)) + 1e-3)
        dense_t, dense_d = target.dense(n_vocab), draft.dense(n_vocab)
        for token in range(n_vocab):
            assert target.prob(token) == dense_t[token]
        assert target.top()[0] == int(np.argmax(dense_t))
        want = np.maximum(dense_t - dense_d, 0)
        got = residual(target, draft)
        if want.sum() > 1e-12:
            np.testing.assert_allclose(got.dense(n_vocab), want / want.sum(), rtol=1e-12, atol=1e-15)
            assert np.all(np.diff(got.ids) > 0)
    # A one-hot draft inside a full-vocabulary target: no merge, the target minus the draft's token.
    full = ArrayLaw(np.arange(n_vocab, dtype=np.int64), np.full(n_vocab, 1 / n_vocab))
    rest = residual(full, ArrayLaw.one_hot(4))
    assert 4 not in rest.ids.tolist() and len(rest.ids) == n_vocab - 1


def test_top_p_window_is_a_prefix_of_the_sorted_row() -> None:
    """Top-p without top-k or min-p cuts inside a window of the best values. A penalised token that fell below
    the window must not stand in for the tokens between it and the window (constructed so the cut lands
    exactly there)."""
    n_rest = 100
    row = np.full(10 + n_rest + 1, -7.5, dtype=np.float32)
    row[:10] = 0.0  # ten best tokens
    penalised = 10 + n_rest  # raw -7.5, penalised to -9.75: below the first window (7 nats at T = 1)
    low = float(np.float32(-7.5) * np.float32(1.3))
    total = 10 + n_rest * np.exp(-7.5) + np.exp(low)
    top_p = (10 + 0.5 * np.exp(low)) / total  # just past the ten best: the cut takes one more token
    params = SamplingParams(
        temperature=1.0, top_k=0, min_p=0.0, top_p=float(top_p), repeat_penalty=1.3, repeat_last_n=4
    )
    law = reference_law(row, [penalised], params)
    assert len(law) == 11 and penalised not in law  # the 11th token is one of the -7.5 ones
    assert_same_law(sampling_law(row, [penalised], params), law)


class _Uniform:
    """Hands out a fixed uniform: the draw is then a function of the law alone."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def test_sample_and_top_are_the_same_on_small_and_large_supports() -> None:
    """Small supports are walked in Python floats, large ones with numpy: both must pick, for the same uniform,
    the token of the float64 inverse CDF (a running sum, left to right), and `top` the lower id among equals."""
    rng = np.random.default_rng(11)
    for size in [1, 2, 3, 40, 63, 64, 65, 200]:
        for _ in range(200):
            ids = np.sort(rng.choice(10 * size, size=size, replace=False)).astype(np.int64)
            weights = np.round(rng.random(size) * 4) + 1  # ties are common
            law = ArrayLaw(ids, weights / weights.sum())
            u = float(rng.random())
            cdf = np.cumsum(law.probs)
            want = int(ids[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), size - 1)])
            assert law.sample(_Uniform(u)) == want
            best = int(np.argmax(law.probs))
            assert law.top() == (int(ids[best]), float(law.probs[best]))
    edge = ArrayLaw(np.array([3, 9], dtype=np.int64), np.array([0.5, 0.5]))
    assert edge.sample(_Uniform(0.0)) == 3 and edge.sample(_Uniform(0.5)) == 9  # the CDF's right-continuity
