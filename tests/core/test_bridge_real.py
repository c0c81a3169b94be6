"""Bridged drafts on the two real models from PyPI: Gemma 3 270M (262,144 tokens, SentencePiece) and SmolLM2-135M
(49,152 tokens, byte-level BPE), each drafting for the other.

SmolLM2 → Gemma runs on the shared tokens (94 % of SmolLM2's tokens are one Gemma token by their bytes); Gemma →
SmolLM2 runs through text (18 % of Gemma's are SmolLM2 tokens). Greedy output must equal the target alone except at a
near-tie, judged against the batched-vs-single-row logit noise measured at that very point (Gemma's Q4_K_M rows
move by up to ~1.7 between a 5-row batch and single rows: docs/DESIGN.md "How it works"); texts that stress token
boundaries must draft and verify without error, with both caches consistent; at T = 1 the first two tokens follow
Gemma's own law (the negative control of that check runs on the tiny models, in test_bridge.py).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from support import GREEDY, run_to_end

from localspec.core.engine import Engine
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.llama.context import Context
from localspec.llama.model import Model

FIXED = SpeculativeParams(draft_max=4, adaptive=False)
N_TOKENS = 40
PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]
BOUNDARY_TEXTS = [
    "Translate: naïve café, déjà vu, Straße, 日本語のテキスト, Ελληνικά →",
    "Emoji: 😀👍🏽 🇫🇷👨‍👩‍👧 and more 🎉🎉🎉",
    "Spaces:     five, tabs\t\t\ttwo,\n\n\n\nfour newlines,   then text",
    "```python\nclass A:\n    def f(self, x: int) -> dict[str, list[int]]:\n        return {'a': [x ** 2]}\n```\n",
]


@pytest.fixture(scope="module", params=["smollm2->gemma", "gemma->smollm2"])
def pair(request, gemma_path, smollm2_path):
    """(target path, plain engine, bridged engine, mode) for one direction."""
    target, draft, mode = (
        (gemma_path, smollm2_path, "shared")
        if request.param == "smollm2->gemma"
        else (smollm2_path, gemma_path, "text")
    )
    with Engine.load(target, drafter="none", n_ctx=512) as plain, Engine.load(target, draft, n_ctx=512) as bridged:
        assert bridged.bridge is not None and bridged.bridge.mode == mode
        yield target, plain, bridged


def single_row_logits(ctx: Context, tokens: list[int]) -> np.ndarray:
    """The row after `tokens` as plain decoding computes it: the prefix, then the last token on its own."""
    ctx.clear()
    ctx.decode(tokens[:-1], 0, outputs=0)
    ctx.decode(tokens[-1:], len(tokens) - 1, outputs=1)
    return ctx.logits(0).astype(np.float64)


def near_tie(path, tokens: list[int], rows: int = 5) -> tuple[float, float]:
    """(top-2 gap of the single-row logits after `tokens`, largest |batched − single-row| logit at that row when
    the last `rows` tokens are decoded as one batch, as verification does)."""
    with Model(path) as model, Context(model, n_ctx=512) as ctx:
        single = single_row_logits(ctx, tokens)
        ctx.clear()
        ctx.decode(tokens[:-rows], 0, outputs=0)
        ctx.decode(tokens[-rows:], len(tokens) - rows, outputs=rows)
        batched = ctx.logits(rows - 1).astype(np.float64)
    top = np.sort(single)[-2:]
    return float(top[1] - top[0]), float(np.abs(batched - single).max())


def assert_same_or_near_tie(path, prompt: list[int], reference: list[int], other: list[int]) -> None:
    at = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if at is None:
        assert len(other) == len(reference)
        return
    gap, noise = near_tie(path, prompt + reference[:at])
    assert gap < 2 * noise, f"the bridged run leaves the target's at token {at}: top-2 gap {gap:.3f}, noise {noise:.3f}"


@pytest.mark.parametrize("text", PROMPTS)
def test_bridged_greedy_equals_the_target_alone(pair, text):
    path, plain, bridged = pair
    prompt = plain.tokenize(text)
    reference = run_to_end(plain, prompt, sampling=GREEDY, max_tokens=N_TOKENS).tokens
    gen = run_to_end(bridged, prompt, sampling=GREEDY, spec=FIXED, max_tokens=N_TOKENS)
    bridged.check_invariants()
    assert_same_or_near_tie(path, prompt, reference, gen.tokens)
    assert gen.stats.drafted > 0 and gen.stats.accepted > 0, gen.stats.summary()


@pytest.mark.parametrize("text", BOUNDARY_TEXTS, ids=["unicode", "emoji", "whitespace", "code"])
def test_boundary_texts_draft_and_verify(pair, text):
    """The prompt and a sampled answer cross byte-token and whitespace boundaries in both tokenizers."""
    _, plain, bridged = pair
    prompt = bridged.tokenize(text)
    for sampling_seed in (None, 3):
        sampling = GREEDY if sampling_seed is None else SamplingParams(temperature=1.0, seed=sampling_seed)
        gen = run_to_end(bridged, prompt, sampling=sampling, spec=FIXED, max_tokens=24)
        bridged.check_invariants()
        assert gen.finish_reason in ("length", "stop") and gen.stats.drafted > 0
        # the draft's history spells the target's text (up to the last whole character)
        mirror, draft_model = bridged.drafter.mirror, bridged.bridge.draft
        assert draft_model.detokenize(mirror.draft) == bridged.target_model.detokenize(mirror.target)


LAW_TEXT = "My favourite colour is"
LAW_TOP_K = 3
LAW_RUNS = 600


@pytest.mark.slow
def test_the_t1_law_of_gemma_drafted_by_smollm2_on_the_shared_tokens(gemma_path, smollm2_path):
    """The first two tokens at T = 1, top-k 3 (9 outcomes), against Gemma's own single-row law. 600 draws see a
    misstated law of the size the tiny models' negative control makes (test_bridge.py), not Gemma's batch noise."""
    from support.lawcheck import check_law

    with Model(gemma_path) as model, Context(model, n_ctx=128) as ctx:
        prompt = model.tokenize(LAW_TEXT, add_special=True)
        law: dict[tuple[int, ...], float] = {}
        first = single_row_logits(ctx, prompt)
        for a in np.argsort(-first)[:LAW_TOP_K].tolist():
            second = single_row_logits(ctx, prompt + [a])
            for b in np.argsort(-second)[:LAW_TOP_K].tolist():
                law[(a, b)] = _top_k_prob(first, a) * _top_k_prob(second, b)
    sampling = SamplingParams(temperature=1.0, top_k=LAW_TOP_K, top_p=1.0, min_p=0.0)
    rng = np.random.default_rng(11)
    counts: Counter[tuple[int, ...]] = Counter()
    accepted = 0
    with Engine.load(gemma_path, smollm2_path, n_ctx=128) as engine:
        assert engine.bridge.mode == "shared"
        for _ in range(LAW_RUNS):  # two tokens: one drafted, verified with the bonus row
            spec = SpeculativeParams(draft_max=2, adaptive=False)
            gen = run_to_end(engine, prompt, sampling=sampling, spec=spec, max_tokens=2, rng=rng)
            counts[tuple(gen.tokens[:2])] += 1
            accepted += gen.stats.accepted
    keys = sorted(law)
    outside = sum(n for key, n in counts.items() if key not in law)
    verdict = check_law(np.array([counts[k] for k in keys] + [outside]), np.array([law[k] for k in keys] + [0.0]))
    assert verdict.ok, verdict
    assert 0.2 * LAW_RUNS < accepted < LAW_RUNS  # both the accept and the reject path produced tokens


def _top_k_prob(logits: np.ndarray, token: int) -> float:
    top = np.sort(logits)[-LAW_TOP_K:]
    weights = np.exp(top - top.max())
    return float(np.exp(logits[token] - top.max()) / weights.sum())
