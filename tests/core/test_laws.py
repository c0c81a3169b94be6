"""The `Law` protocol (core/laws.py): every row type answers alike for the same law, and a law restricted to the
tokens a mask allows (where a grammar will hook) is the renormalised law on them — and verifying an
unrestricted draft against it emits exactly that law."""

from __future__ import annotations

import numpy as np
import pytest
from support.lawcheck import check_law

from localspec.core.laws import ArrayLaw, ChainRowLaw, Law, ListLaw
from localspec.core.verify import verify_pq

VOCAB = 8
IDS, PROBS = [5, 1, 3, 6], [0.4, 0.3, 0.2, 0.1]  # best first, as llama.cpp's chain hands them over


class Chain:
    """Stands in for `ChainLawBuilder`: row i's law, and a draw that always picks the token 6."""

    def law(self, ctx, i: int) -> tuple[list[int], list[float]]:
        return IDS, PROBS

    def draw(self, ctx, i: int) -> int:
        return 6


def row_types() -> dict[str, Law]:
    order = np.argsort(IDS)
    return {
        "array": ArrayLaw(np.array(IDS, dtype=np.int64)[order], np.array(PROBS)[order]),
        "list": ListLaw(IDS, PROBS),
        "chain row": ChainRowLaw(Chain(), None, 0),
    }


@pytest.mark.parametrize("kind", ["array", "list", "chain row"])
def test_every_row_type_speaks_the_law_protocol_alike(kind):
    law = row_types()[kind]
    assert isinstance(law, Law)
    assert law.ids.tolist() == [1, 3, 5, 6] and law.probs.tolist() == [0.3, 0.2, 0.4, 0.1]
    assert [law.prob(t) for t in range(VOCAB)] == [0, 0.3, 0, 0.2, 0, 0.4, 0.1, 0]
    assert law.top() == (5, 0.4)
    np.testing.assert_array_equal(law.dense(VOCAB), [0, 0.3, 0, 0.2, 0, 0.4, 0.1, 0])
    allowed = np.zeros(VOCAB, dtype=bool)
    allowed[[1, 6, 7]] = True  # 7 is allowed but has no mass
    restricted = law.restricted(allowed)
    assert restricted.ids.tolist() == [1, 6]
    np.testing.assert_allclose(restricted.probs, [0.75, 0.25])
    assert law.restricted(np.zeros(VOCAB, dtype=bool)) is None  # nothing allowed has any mass
    draws = [law.sample(np.random.default_rng(seed)) for seed in range(200)]
    assert set(draws) <= {1, 3, 5, 6} and (kind != "chain row" or set(draws) == {6})  # the chain draws its own


def test_verifying_against_a_restricted_target_emits_the_restricted_law():
    """A draft that knows nothing of the mask (it proposes forbidden tokens too) verified against the
    restricted target law emits exactly that law."""
    target = ArrayLaw.from_weights(np.arange(6), np.array([0.3, 0.25, 0.2, 0.1, 0.1, 0.05]))
    draft = ArrayLaw.from_weights(np.arange(1, 7), np.array([0.1, 0.3, 0.2, 0.2, 0.1, 0.1]))
    allowed = np.array([True, False, True, True, False, True, True, False])
    restricted = target.restricted(allowed)
    rng, counts = np.random.default_rng(3), np.zeros(VOCAB, dtype=np.int64)
    for x in rng.choice(draft.ids, size=30_000, p=draft.probs).tolist():
        n_accepted, token = verify_pq([x], [draft], [restricted, restricted], rng)
        counts[x if n_accepted else token] += 1
    verdict = check_law(counts, restricted.dense(VOCAB))
    assert verdict.ok, verdict
    assert counts[~allowed].sum() == 0
