"""`ChainLawBuilder`: the target's law as llama.cpp's chain builds it, and its `dist` draw from exactly that law.

A plain step draws with llama.cpp's `dist`; a verified row's law is rebuilt from the chain's survivors. They must be
one law, bit for bit: `dist` writes each survivor's probability after its draw, and the rebuilt law must round to
those very floats (tests 1–2). The draws must follow the law (test 3, with a negative control). And through the step
itself: the plain step draws from the law that verification uses for the same row, on the chain and on numpy.
"""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
from support.lawcheck import check_law

from localspec.core.drafters import DraftRequest, Proposal
from localspec.core.sampling import SamplingParams, sampling_law
from localspec.core.step import TargetLaws, accept_or_reject, target_chain
from localspec.llama.context import Context
from localspec.llama.model import Model
from localspec.llama.sampler import ChainLawBuilder, _Capture

SETTINGS = [  # (temperature, top_k, top_p, min_p)
    (0.8, 40, 0.95, 0.05),  # the defaults
    (1.5, 64, 0.9, 0.0),  # hot: many survivors, top-p cuts
    (0.3, 5, 1.0, 0.1),  # cold: min-p cuts
    (1.0, 1, 1.0, 0.0),  # one survivor
]


def what_dist_wrote(ctx: Context, i: int, temperature, top_k, top_p, min_p) -> dict[int, float]:
    """The same chain ending in `dist` then a capture: {token: the probability `dist` wrote for it} (float32)."""
    capture = _Capture()
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for link in (
        llama_cpp.llama_sampler_init_top_k(top_k),
        llama_cpp.llama_sampler_init_temp(temperature),
        llama_cpp.llama_sampler_init_top_p(top_p, 1),
        llama_cpp.llama_sampler_init_min_p(min_p, 1),
        llama_cpp.llama_sampler_init_dist(1),
        capture.handle,
    ):
        llama_cpp.llama_sampler_chain_add(chain, link)
    try:
        llama_cpp.llama_sampler_sample(chain, ctx.handle, i)
        ids, _ = capture.survivors()
        return dict(zip(ids, capture.probabilities()))  # in dist's order
    finally:
        llama_cpp.llama_sampler_free(chain)


def rows(path, prompt_ids: list[int]):
    model = Model(path)
    ctx = Context(model, n_ctx=256, n_threads=1)
    ctx.decode(prompt_ids, 0, outputs=len(prompt_ids))
    return model, ctx


@pytest.mark.parametrize("which", ["tiny", "gemma"])
def test_the_rebuilt_law_is_the_one_dist_draws_from_bit_for_bit(which, tiny_models, request):
    path = tiny_models.target if which == "tiny" else request.getfixturevalue("gemma_path")
    model, ctx = rows(path, [2, 5, 9, 13, 17, 21, 25, 29])
    try:
        checked = 0
        for settings in SETTINGS:
            law = ChainLawBuilder(**dict(zip(("temperature", "top_k", "top_p", "min_p"), settings)), seed=0)
            try:
                for i in range(8):
                    ids, probs = law.law(ctx, i)
                    wrote = what_dist_wrote(ctx, i, *settings)
                    assert list(wrote) == list(ids)  # the same survivors, in dist's order (best first)
                    assert abs(sum(probs) - 1) < 1e-12 and len(set(ids)) == len(ids)
                    for token, p in zip(ids, probs):
                        assert np.float32(p) == np.float32(wrote[token]), (settings, i, token, p, wrote[token])
                    checked += len(ids)
            finally:
                law.close()
        assert checked > 8 * len(SETTINGS)  # more than one survivor per row on the whole
    finally:
        ctx.close()
        model.close()


def test_the_law_is_ours_up_to_float32_rounding(gemma_path):
    """The chain applies our order (top-k, temperature, top-p, min-p; DESIGN §2) in float32: the same survivors as
    numpy's float64 law on these rows, each probability within float32 rounding."""
    model, ctx = rows(gemma_path, [2, 5, 9, 13, 17, 21, 25, 29])
    try:
        for temperature, top_k, top_p, min_p in SETTINGS:
            params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
            law = ChainLawBuilder(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=0)
            try:
                for i in range(8):
                    ids, probs = law.law(ctx, i)
                    ours = sampling_law(ctx.logits(i), [], params)
                    order = np.argsort(ids)
                    assert np.array(ids)[order].tolist() == ours.ids.tolist(), (temperature, top_k, i)
                    assert np.max(np.abs(np.array(probs)[order] - ours.probs)) < 1e-5
            finally:
                law.close()
    finally:
        ctx.close()
        model.close()


def test_the_chains_draws_follow_its_law_and_another_law_fails(tiny_models):
    model, ctx = rows(tiny_models.target, [2, 5, 9])
    law = ChainLawBuilder(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0, seed=5)
    hotter = ChainLawBuilder(temperature=1.6, top_k=4, top_p=1.0, min_p=0.0, seed=5)
    try:
        ids, probs = law.law(ctx, 2)
        assert len(ids) == 4 and max(probs) < 0.9  # a spread-out row, or the check would prove little
        drawn = [law.draw(ctx, 2) for _ in range(20_000)]
        counts = [drawn.count(t) for t in ids]
        assert sum(counts) == len(drawn)  # never outside the survivors
        assert check_law(counts, probs).ok, check_law(counts, probs)
        assert not check_law(counts, hotter.law(ctx, 2)[1]).ok  # negative control: the law at T 1.6
    finally:
        law.close()
        hotter.close()
        ctx.close()
        model.close()


@pytest.mark.parametrize("path", ["chain", "numpy"])
def test_a_plain_step_draws_from_the_law_verification_uses_for_that_row(tiny_models, path, monkeypatch):
    """The plain step (k = 0) and the speculative step's verification build the same law for the same row: the
    plain step's draws on a decoded row follow `TargetLaws(...)[0]`, the law p/q reads, on both paths."""
    if path == "numpy":
        monkeypatch.setenv("LOCALSPEC_CHAIN_LAW", "off")
    sampling = SamplingParams(temperature=1.0, top_k=4, top_p=0.97, min_p=0.02)
    model, ctx = rows(tiny_models.target, [2, 5, 9])
    ctx.decode([11], 3, outputs=1)  # a plain step's row: the only output of a one-token decode
    rng = np.random.default_rng(3)
    chain = target_chain(ctx, sampling, rng)
    try:
        assert (chain is None) == (path == "numpy")
        request = DraftRequest(history=[2, 5, 9, 11], k=0, sampling=sampling, pq=True, p_min=0.0, rng=rng, chain=chain)
        law = TargetLaws(ctx, [], [], sampling, chain)[0]
        drawn = [accept_or_reject(Proposal(), ctx, request)[1] for _ in range(12_000)]
        counts = [drawn.count(t) for t in law.ids.tolist()]
        assert sum(counts) == len(drawn)
        assert check_law(counts, law.probs).ok, check_law(counts, law.probs)
        sharper = law.probs**1.5 / (law.probs**1.5).sum()  # negative control: another law on the same tokens
        assert not check_law(counts, sharper).ok
    finally:
        if chain is not None:
            chain.close()
        ctx.close()
        model.close()


def test_who_builds_the_law_by_vocabulary_and_drafting(tiny_models, gemma_path):
    """The chain where it is the cheaper (measured, docs/benchmarks.md "Where the target's law is built"): the
    target's law up to 2^16 tokens, or in a generation that never drafts; past that, numpy for a drafting generation
    and for the draft's own law."""
    from localspec.core.drafters import DraftLawBuilder
    from localspec.core.laws import ArrayLaw, ListLaw

    sampling = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    for path, large in ((tiny_models.target, False), (gemma_path, True)):
        model, ctx = rows(path, [2, 5, 9])
        try:
            rng = np.random.default_rng(0)
            plain, drafting = target_chain(ctx, sampling, rng, drafting=False), target_chain(ctx, sampling, rng)
            assert plain is not None and (drafting is None) == large
            draft_law = DraftLawBuilder()
            assert isinstance(draft_law(ctx, [], sampling), ArrayLaw if large else ListLaw)
            for chain in (plain, drafting):
                if chain is not None:
                    chain.close()
            draft_law.close()
            penalised = SamplingParams(temperature=0.8, top_k=40, repeat_penalty=1.2)
            assert target_chain(ctx, penalised, rng, drafting=False) is None  # penalties: numpy's law
        finally:
            ctx.close()
            model.close()
