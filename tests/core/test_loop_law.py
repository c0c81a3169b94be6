"""T2 (DESIGN §6): the production loop emits exactly the target's law, on a model with known conditionals.

A numpy model (tests/support/fakellm.py) serves logits that are a pure function of the prefix, so the exact law
of the first three tokens under the full sampling transform (penalties over the whole history, the
tokens accepted in the current step included; temperature, top-k, top-p, min-p) is a finite product.
Many seeded generations through the real `Engine` / `Generation` / `speculative_step` / drafters /
policy, with k ∈ {1, 3, 5}, adaptive k, both verifications and every drafter, must match it (TV and
chi-square); greedy speculative decoding must equal plain greedy decoding token for token.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support.fakellm import LogitTable, fake_engine
from support.lawcheck import check_law, expected_tv

from localspec.core.drafters import DraftRequest, NgramFirst
from localspec.core.laws import ArrayLaw
from localspec.core.params import SpeculativeParams
from localspec.core.policy import DraftPolicy, EstimatedCosts
from localspec.core.sampling import SamplingParams

VOCAB = 5
PROMPT = [1, 3, 0, 4, 1, 3, 2, 0]
TARGET = LogitTable(VOCAB, seed=0)
DRAFT = LogitTable(VOCAB, seed=1, base=TARGET, noise=1.2)  # partial acceptance
SAMPLING = SamplingParams(temperature=1.0, top_k=4, top_p=0.97, min_p=0.03, repeat_penalty=1.6, repeat_last_n=4)
N_RUNS = 4000


def step_law(prefix: list[int], params: SamplingParams) -> np.ndarray:
    """The target's sampling law (VOCAB,) after `prefix`, from the full-sort reference of the transform."""
    from support.sampling_reference import reference_dense

    return reference_dense(TARGET.logits(tuple(prefix)), prefix, params)


def exact_law(params: SamplingParams, n_tokens: int = 3) -> np.ndarray:
    """P(first n_tokens) as a flat (VOCAB ** n_tokens,) vector, outcome index = base-VOCAB digits."""
    probs = np.zeros(VOCAB**n_tokens)
    for outcome in itertools.product(range(VOCAB), repeat=n_tokens):
        p, prefix = 1.0, list(PROMPT)
        for token in outcome:
            p *= step_law(prefix, params)[token]
            prefix.append(token)
        probs[np.ravel_multi_index(outcome, (VOCAB,) * n_tokens)] = p
    return probs


def sample_first_tokens(engine, spec: SpeculativeParams, n_runs: int, seed: int) -> tuple[np.ndarray, list]:
    """Histogram of the first 3 tokens over n_runs generations, and each generation's stats."""
    rng = np.random.default_rng(seed)
    counts, stats = np.zeros(VOCAB**3, dtype=np.int64), []
    for _ in range(n_runs):
        gen = engine.generate(PROMPT, sampling=SAMPLING, spec=spec, max_tokens=max(3, spec.draft_max + 1), rng=rng)
        for _ in gen:
            pass
        counts[np.ravel_multi_index(tuple(gen.tokens[:3]), (VOCAB,) * 3)] += 1
        stats.append(gen.stats)
    return counts, stats


@pytest.fixture(scope="module")
def law() -> np.ndarray:
    return exact_law(SAMPLING)


def assert_law(counts: np.ndarray, law: np.ndarray) -> None:
    verdict = check_law(counts, law)
    assert verdict.ok, verdict
    assert verdict.tv < 1.5 * expected_tv(law, verdict.n), verdict


def test_the_exact_law_is_not_trivial(law):
    assert np.count_nonzero(law) > 20 and law.max() < 0.2
    # The penalties shape it: without them the law is far from this one.
    unpenalised = exact_law(SamplingParams(temperature=1.0, top_k=4, top_p=0.97, min_p=0.03))
    assert 0.5 * np.abs(unpenalised - law).sum() > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["pq", "match"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_model_drafter_emits_the_target_law(law, k, verify):
    engine = fake_engine(TARGET, DRAFT)
    counts, stats = sample_first_tokens(
        engine, SpeculativeParams(draft_max=k, verify=verify, adaptive=False), N_RUNS, seed=k
    )
    assert_law(counts, law)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert 0.2 * drafted < accepted < 0.9 * drafted  # both paths of the kernel were exercised


@pytest.mark.slow
def test_pq_accepts_more_than_match():
    accepted = {}
    for verify in ("pq", "match"):
        _, stats = sample_first_tokens(
            fake_engine(TARGET, DRAFT), SpeculativeParams(draft_max=3, verify=verify, adaptive=False), 1000, seed=0
        )
        accepted[verify] = sum(s.accepted for s in stats) / sum(s.drafted for s in stats)
    assert accepted["pq"] > accepted["match"] + 0.05, accepted


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram", "model+ngram"])
def test_lookup_drafters_emit_the_target_law(law, drafter):
    engine = fake_engine(TARGET, DRAFT, drafter)
    counts, stats = sample_first_tokens(engine, SpeculativeParams(draft_max=3, adaptive=False), N_RUNS, seed=7)
    assert_law(counts, law)
    accepted, drafted = sum(s.accepted for s in stats), sum(s.drafted for s in stats)
    assert 0 < accepted < drafted and sum(s.rejections for s in stats) > 0  # accept and residual paths ran


@pytest.mark.slow
def test_adaptive_draft_length_emits_the_target_law(law):
    """k chosen each step from α̂ (which depends on earlier outcomes) keeps the law exact."""
    engine = fake_engine(TARGET, DRAFT)
    engine.policy = DraftPolicy(costs=EstimatedCosts(draft_ratio=0.05, batch_slope=0.1))
    counts, stats = sample_first_tokens(engine, SpeculativeParams(draft_max=5), N_RUNS, seed=11)
    assert_law(counts, law)
    used = np.zeros(6, dtype=np.int64)
    for s in stats:
        used[: len(s.steps_by_draft_length)] += s.steps_by_draft_length
    assert np.count_nonzero(used[1:]) >= 3, used  # k really varied


def chain_engine(copy_max: int | None = 1):
    """The tables' engine drafting with the n-gram chain, its copy capped at `copy_max` tokens so that a proposal
    mixes copied tokens (point laws) and the draft model's after them (drawn from its law after the copy)."""
    engine = fake_engine(TARGET, DRAFT, "model")
    engine.use_drafter(NgramFirst(engine.drafter, copy_max=copy_max))  # around its ModelDrafter
    return engine


class MislabelledChain(NgramFirst):
    """Negative control: each copied token is said to be drawn from a uniform law, not the point law it is (a copy
    is a function of the history), so verification accepts it with probability min(1, VOCAB · target(x)) instead of
    target(x). (The other mislabelling, a sampled token called a point law, stays exact: a one-hot draft is exact
    whatever chose its token, as long as the choice does not see the verification's draws.)"""

    def propose(self, request):
        out = super().propose(request)
        uniform = ArrayLaw(np.arange(VOCAB, dtype=np.int64), np.full(VOCAB, 1.0 / VOCAB))
        out.laws = [uniform if law is None else law for law in out.laws]
        return out


@pytest.mark.slow
def test_the_chain_emits_the_target_law_with_copies_and_model_tokens_in_one_proposal(law):
    engine = chain_engine()
    counts, stats = sample_first_tokens(engine, SpeculativeParams(draft_max=3, adaptive=False), N_RUNS, seed=5)
    assert_law(counts, law)
    accepted, drafted = sum(s.accepted for s in stats), sum(s.drafted for s in stats)
    assert 0 < accepted < drafted and sum(s.rejections for s in stats) > 0


def test_the_chain_mixes_copied_and_model_tokens():
    """What the law test above runs: proposals whose first token is copied and the rest the model's, with its laws."""
    engine = chain_engine()
    history = [*PROMPT, 4, 1, 3]  # "4 1 3" occurred: the copy is "2", then the model drafts after "... 4 1 3 2"
    proposal = engine.drafter.propose(
        DraftRequest(history=history, k=3, sampling=SAMPLING, pq=True, p_min=0.0, rng=np.random.default_rng(0))
    )
    assert proposal.tokens[0] == 2 and len(proposal.tokens) == 3
    assert proposal.laws[0] is None and all(law is not None for law in proposal.laws[1:])
    assert proposal.cost.decoded > 0  # the model read the copy and drafted after it


@pytest.mark.slow
def test_a_chain_that_mislabels_its_model_tokens_fails_the_same_check(law):
    """Negative control: the same check sees copied tokens verified as if they had been sampled."""
    engine = fake_engine(TARGET, DRAFT, "model")
    engine.use_drafter(MislabelledChain(engine.drafter, copy_max=1))
    counts, _ = sample_first_tokens(engine, SpeculativeParams(draft_max=3, adaptive=False), N_RUNS, seed=5)
    verdict = check_law(counts, law)
    assert not verdict.ok, f"a mislabelled chain passed: {verdict}"


GREEDY_PENALISED = SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=6)  # greedy, not plain


@pytest.mark.parametrize("drafter", ["model", "ngram", "model+ngram", "chain with model tokens after a copy"])
def test_greedy_speculative_equals_plain_greedy(drafter):
    plain_engine = fake_engine(TARGET, None, "none")
    for prompt in ([1, 3, 0, 4], [2, 2, 2], [0, 1, 2, 3, 4, 0, 1]):
        plain = plain_engine.generate(prompt, sampling=GREEDY_PENALISED, max_tokens=30)
        list(plain)
        for spec in [SpeculativeParams(draft_max=k, adaptive=False) for k in (1, 3, 5)] + [SpeculativeParams()]:
            engine = chain_engine(copy_max=2) if drafter.startswith("chain") else fake_engine(TARGET, DRAFT, drafter)
            engine.policy = DraftPolicy(costs=EstimatedCosts(draft_ratio=0.05, batch_slope=0.1))
            gen = engine.generate(prompt, sampling=GREEDY_PENALISED, spec=spec, max_tokens=30)
            list(gen)
            assert gen.tokens == plain.tokens, (prompt, spec)
            assert gen.stats.drafted > 0


@pytest.mark.slow
def test_a_broken_kernel_in_the_loop_fails_the_same_check(law, monkeypatch):
    """Negative control: the loop-level check sees a kernel that resamples from the target on rejection."""
    from support.lawcheck import broken_pq

    monkeypatch.setattr("localspec.core.step.verify_pq", broken_pq)
    counts, _ = sample_first_tokens(
        fake_engine(TARGET, DRAFT), SpeculativeParams(draft_max=3, adaptive=False), N_RUNS, seed=3
    )
    verdict = check_law(counts, law)
    assert not verdict.ok, f"a broken kernel passed: {verdict}"
