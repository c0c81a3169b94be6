"""What many tests share: the greedy settings, the standard prompt, runs to the end, and divergence checks.

Batched and one-at-a-time logits may differ in the last bits (docs/DESIGN.md §7), so two greedy runs may part
only at a near-tie of the reference model (top-2 logit gap < NEAR_TIE); `divergence` asserts exactly that.
Bigger fakes and fixtures live beside this file: `tinymodels` (GGUF writers), `fakellm` (table models),
`fakehub` (a local Hub), `lawcheck` (statistics), `sampling_reference` (the full-sort sampler), `tui` (Pilot).
"""

from __future__ import annotations

import numpy as np

from localspec.core.engine import Engine
from localspec.core.params import SpeculativeParams
from localspec.core.sampling import SamplingParams
from localspec.llama.context import Context
from localspec.llama.model import Model

NEAR_TIE = 1e-3
GREEDY = SamplingParams(temperature=0)
PROMPT = "the man said that the water was hot and"


def run_greedy(engine: Engine, prompt: list[int], k: int, n: int = 48):
    spec = SpeculativeParams(draft_max=k, adaptive=False)  # fixed k: the stats below are deterministic
    gen = engine.generate(prompt, sampling=GREEDY, spec=spec, max_tokens=n)
    events = list(gen)
    assert events[-1].finish_reason == "length"
    return gen


def top2_gap(path, tokens: list[int]) -> float:
    """Top-2 logit gap of the model after `tokens`, computed in a fresh context."""
    with Model(path) as model, Context(model, n_ctx=512) as ctx:
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
