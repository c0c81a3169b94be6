"""The n-gram (prompt lookup) drafter and the model+ngram combination: what they propose, and that they
load, draft and stay exact in the real engine and CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fakellm import LogitTable, fake_engine

from localspec.cli import main
from localspec.drafters import LookupModelDrafter, NgramDrafter, lookup
from localspec.engine import Engine, SpeculativeParams
from localspec.errors import InvalidParamsError
from localspec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
FIXED = SpeculativeParams(draft_max=6, adaptive=False)


@pytest.mark.parametrize(
    "history, k, n_min, want",
    [
        ([1, 2, 3, 4, 5, 1, 2, 3], 4, 1, [4, 5, 1, 2]),  # the 3-gram "1 2 3" seen before
        ([1, 2, 3, 4, 5, 9, 2, 3], 4, 1, [4, 5, 9, 2]),  # only the 2-gram "2 3"
        ([1, 2, 3, 4, 5, 9, 8, 3], 4, 1, [4, 5, 9, 8]),  # only the 1-gram "3"
        ([1, 2, 3, 4, 5, 9, 8, 3], 4, 2, []),  # ... which n_min 2 does not take
        ([7, 1, 2, 8, 1, 2, 9, 1, 2], 2, 2, [9, 1]),  # the latest occurrence wins
        ([1, 2, 1, 2], 5, 2, [1, 2]),  # the continuation stops at the end of the history
        ([5], 3, 1, []),
    ],
)
def test_lookup_continues_the_latest_longest_match(history, k, n_min, want):
    assert lookup(history, k, n_max=3, n_min=n_min) == want


def test_ngram_proposals_are_one_hot():
    proposal = NgramDrafter().propose([1, 2, 3, 1, 2], 3, GREEDY, sample=True, p_min=0.9, rng=np.random.default_rng(0))
    assert proposal.tokens == [3, 1, 2] and proposal.dists == [None, None, None]


def test_model_plus_ngram_uses_the_model_without_a_match():
    target = LogitTable(5, seed=0)
    engine = fake_engine(target, LogitTable(5, seed=1, base=target, noise=0.3), "model+ngram")
    assert isinstance(engine.drafter, LookupModelDrafter)
    rng = np.random.default_rng(0)
    with_match = engine.drafter.propose([1, 2, 3, 4, 1, 2], 3, GREEDY, sample=False, p_min=0.0, rng=rng)
    assert with_match.tokens == [3, 4, 1] and engine.drafter.seq.n_past == 0  # the model never ran
    without = engine.drafter.propose([0, 1, 2, 3, 4], 3, GREEDY, sample=False, p_min=0.0, rng=rng)
    assert len(without.tokens) == 3 and engine.drafter.seq.n_past > 0


REPEAT = "the man said what the man said what the man said what the man said"


@pytest.mark.parametrize("drafter", ["ngram", "model+ngram"])
def test_lookup_drafters_in_the_real_engine_equal_plain_greedy(tiny_models, drafter):
    draft = tiny_models.draft_unrelated if drafter == "model+ngram" else None
    with Engine.load(tiny_models.target, draft, drafter=drafter, n_ctx=256) as engine:
        prompt = engine.tokenize(REPEAT)
        plain = engine.generate(prompt, sampling=GREEDY, spec=SpeculativeParams(draft_max=0), max_tokens=40)
        list(plain)
        spec = engine.generate(prompt, sampling=GREEDY, spec=FIXED, max_tokens=40)
        list(spec)
    assert spec.tokens == plain.tokens  # tiny F32 models: no near-tie on this prompt
    assert spec.stats.drafted > 0  # a random-weight model rarely repeats the prompt: acceptance is for bench_sampling


def test_cli_ngram_drafter_and_its_errors(tiny_models, capsys, localspec_home):
    code = main(
        [
            "generate",
            REPEAT,
            "--target",
            str(tiny_models.target),
            "--drafter",
            "ngram",
            "--max-tokens",
            "12",
            "--seed",
            "1",
            "--no-adaptive",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["stats"]["drafted"] > 0
    code = main(["generate", "hi", "--target", str(tiny_models.target), "--drafter", "model+ngram"])
    err = capsys.readouterr().err
    assert code == 1 and "--drafter model+ngram needs --draft PATH" in err
    with pytest.raises(InvalidParamsError, match="unknown drafter"):
        Engine.load(tiny_models.target, drafter="lookup")
