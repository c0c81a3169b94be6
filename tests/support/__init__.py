"""What many tests share: the greedy settings, the standard prompt, runs to the end, and divergence checks.

Batched and one-at-a-time logits may differ in the last bits (docs/DESIGN.md §7), so two greedy runs may part
only at a near-tie of the reference model (top-2 logit gap < NEAR_TIE); `divergence` asserts exactly that.
Bigger fakes and fixtures live beside this file: `tinymodels` (GGUF writers; `tinyglm`: an MTP target for slots),
`fakellm` (table models), `fakehub` (a local Hub), `lawcheck` (statistics), `sampling_reference` (the full-sort
sampler), `tui` (Pilot).
"""

from __future__ import annotations

import numpy as np

from localspec.core.engine import Engine, Generation
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.llama.context import Context
from localspec.llama.model import Model

NEAR_TIE = 1e-3
GREEDY = SamplingParams(temperature=0)
PROMPT = "the man said that the water was hot and"


def run_to_end(engine: Engine, prompt: list[int], **settings) -> Generation:
    """`engine.generate(prompt, **settings)` iterated to its end; read `tokens`, `stats`, `finish_reason`."""
    gen = engine.generate(prompt, **settings)
    for _ in gen:
        pass
    return gen


def run_greedy(engine: Engine, prompt: list[int], k: int, n: int = 48) -> Generation:
    """A greedy run of exactly `n` tokens with a fixed k (the stats are then deterministic)."""
    gen = run_to_end(engine, prompt, sampling=GREEDY, spec=SpeculativeParams(draft_max=k, adaptive=False), max_tokens=n)
    assert gen.finish_reason == "length"
    return gen


def top2_gap(path, tokens: list[int]) -> float:
    """Top-2 logit gap of the model after `tokens`, computed in a fresh context."""
    with Model(path) as model, Context(model, n_ctx=max(512, len(tokens) + 1)) as ctx:
        ctx.decode(tokens, 0, outputs=1)
        top = np.sort(ctx.logits(-1))[-2:]
        return float(top[1] - top[0])


def divergence(path, prompt: list[int], reference: list[int], other: list[int]) -> int | None:
    """Index where `other` leaves `reference`; asserts it is a near-tie of the reference model."""
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            gap = top2_gap(path, prompt + reference[:i])
            assert gap < NEAR_TIE, f"greedy runs diverge at token {i} with a clear top-2 gap {gap:.4f}"
            return i
    assert len(reference) == len(other)
    return None


def assert_identical(path, prompt: list[int], reference: list[int], other: list[int]) -> None:
    """The two greedy runs are the same tokens. For the tiny F32 models, whose batched and single-row logits
    differ by ~1e-3, no near-tie occurs on the tests' prompts: a difference is a bug, reported with its gap."""
    at = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if at is not None:
        gap = top2_gap(path, prompt + reference[:at])
        raise AssertionError(f"greedy runs differ at token {at} (reference top-2 gap {gap:.5f}); none expected here")
    assert len(reference) == len(other), f"{len(other)} tokens where the reference has {len(reference)}"
