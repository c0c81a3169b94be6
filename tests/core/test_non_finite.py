"""Non-finite logits and vanishing temperatures (issue 44): never a wrong token, never an IndexError.

A temperature below `GREEDY_BELOW` is greedy (logits / T overflowed float32 and the law came out NaN); a row with a
NaN or an infinity anywhere is one line naming the model, checked on values the sampling path computes anyway (the
argmax's value, the column maxima, the softmax's maximum): the rows here put one NaN at every kind of position.
The CLI cases run the real `generate` on the tiny pair and on a tiny model whose weights are NaN.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.badinput import assert_outcome, run_main
from support.tinymodels import make_llama_tensors, write_llama_model

from localspec.core.laws import ArrayLaw
from localspec.core.sampling import GREEDY_BELOW, SamplingParams, greedy_token, sampling_law, top_probability
from localspec.errors import NonFiniteLogitsError

LAWS = {
    "greedy": SamplingParams(temperature=0.0),
    "greedy-penalised": SamplingParams(temperature=0.0, repeat_penalty=1.3),
    "top-k": SamplingParams(temperature=0.8),
    "min-p": SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.05),
    "top-p": SamplingParams(temperature=0.8, top_k=0, top_p=0.9, min_p=0.0),
    "softmax": SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0),
}


def row_of(n_vocab: int = 49_152, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n_vocab) * 3).astype(np.float32)


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", [0, 1, 777, 49_151, "all"])
def test_a_row_with_a_nan_or_an_infinity_anywhere_is_refused(law, bad, where):
    row = row_of()
    if where == "all":
        row[:] = bad
    else:
        row[where] = bad
    history = [5, 6, 7]
    with pytest.raises(NonFiniteLogitsError, match="not numbers"):
        if LAWS[law].greedy:
            greedy_token(row, history, LAWS[law])
        else:
            sampling_law(row, history, LAWS[law])


def test_the_draft_confidence_and_a_candidates_law_are_checked_too():
    row = row_of()
    row[123] = np.nan
    with pytest.raises(NonFiniteLogitsError):
        top_probability(row)
    with pytest.raises(NonFiniteLogitsError):
        ArrayLaw.from_logits(np.arange(4), np.array([1.0, np.nan, 2.0, 0.5], dtype=np.float32))


def test_a_finite_row_with_minus_infinity_masked_tokens_still_samples():
    row = row_of()
    row[::3] = -np.inf  # masked tokens are -inf: not an error
    assert np.isfinite(row[greedy_token(row, [], LAWS["greedy"])])
    for law in ("top-k", "min-p", "top-p", "softmax"):
        dist = sampling_law(row, [], LAWS[law])
        assert abs(dist.probs.sum() - 1) < 1e-9 and dist.probs[dist.ids % 3 == 0].sum() == 0


@pytest.mark.parametrize("temperature", [1e-39, 1e-30, 1e-12, GREEDY_BELOW / 2])
def test_a_temperature_below_the_threshold_is_greedy(temperature):
    params = SamplingParams(temperature=temperature)
    assert params.greedy and params.temperature == 0.0
    assert SamplingParams(temperature=GREEDY_BELOW).temperature == GREEDY_BELOW  # the threshold itself samples
    row = row_of()
    assert sampling_law(row, [], params).ids.tolist() == [int(row.argmax())]


def _generate(args: list, capsys) -> dict:
    outcome = run_main(["generate", "--max-tokens", "12", "--json", *args, "Hello there"], capsys)
    assert_outcome(outcome, 0)
    return json.loads(outcome.out)


@pytest.mark.parametrize("drafter", ["model", "none"])
@pytest.mark.slow
def test_a_vanishing_temperature_gives_the_greedy_text(chat_home, capsys, drafter):
    """Before: IndexError in `_draw` with the draft model, garbage sampled with --drafter none."""
    greedy = _generate(["--temperature", "0", "--drafter", drafter], capsys)
    tiny = _generate(["--temperature", "1e-39", "--drafter", drafter, "--seed", "3"], capsys)
    assert tiny["tokens"] == greedy["tokens"]


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    """The tiny target with NaN in its output norm: every logit of every row is NaN."""
    tensors = make_llama_tensors(0)
    tensors["output_norm.weight"] = np.full_like(tensors["output_norm.weight"], np.nan)
    return write_llama_model(tmp_path_factory.mktemp("nan") / "nan-weights.gguf", base=tensors)


@pytest.mark.parametrize("temperature", ["0", "0.8"])
@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_nan_weights_are_one_line_naming_the_model_never_a_token(chat_home, capsys, nan_model, temperature, drafter):
    """Before: token 0 eight times at T 0 with no word, an IndexError at T 0.8."""
    outcome = run_main(
        [
            "generate",
            "--target",
            nan_model,
            "--drafter",
            drafter,
            "--temperature",
            temperature,
            "--max-tokens",
            "8",
            "--json",
            "Hello",
        ],
        capsys,
    )
    assert_outcome(outcome, 1, "the target (nan-weights.gguf) computed logits that are not numbers")
    assert outcome.out == ""


def test_a_draft_with_nan_weights_is_named_as_the_draft(chat_home, capsys, nan_model, tiny_models):
    outcome = run_main(
        [
            "generate",
            "--target",
            tiny_models.target,
            "--draft",
            nan_model,
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "Hello",
        ],
        capsys,
    )
    assert_outcome(outcome, 1, "the draft (nan-weights.gguf) computed logits that are not numbers")
