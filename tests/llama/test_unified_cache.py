"""Why the slots of `serve --parallel` keep their cells apart rather than in llama.cpp's one shared pool (issue 56,
"one KV pool for all slots"; DESIGN §8): in the pinned llama.cpp a sequence whose next cell lands in a hole another
sequence left before its own cells attends wrongly — its logits move by tenths, and greedy answers in a shared batch
changed (tests/core/test_slots.py caught it). Kept apart, the same steps are exact. When this test fails, the
build places cells right and the pool can be shared (four slots in the memory of one --n-ctx)."""

from __future__ import annotations

import numpy as np

from localspec.llama.context import Context
from localspec.llama.model import Model

A = [5 + (7 * i) % 190 for i in range(48)]
B = [9 + (11 * i) % 180 for i in range(44)]


class _Unified(Context):
    def _configure(self, params) -> None:
        params.kv_unified = True  # one pool of cells for every sequence


def _next_row(ctx: Context) -> np.ndarray:
    ctx.decode(A, 0, outputs=0, seq=0)  # sequence 0 first: its cells come before sequence 1's
    ctx.decode(B[:42], 0, outputs=0, seq=1)
    ctx.remove_from(40, 0)  # a hole before sequence 1's cells
    ctx.decode(B[42:43], 42, outputs=1, seq=1)  # lands in it
    return ctx.logits(-1).copy()


def test_one_shared_pool_misplaces_a_cell_that_lands_before_its_sequence(smollm2_path):
    with Model(smollm2_path) as model:
        with Context(model, n_ctx=256) as alone:
            alone.decode(B[:43], 0, outputs=1)
            reference = alone.logits(-1).copy()
        with Context(model, n_ctx=256, n_seq=2) as apart:
            assert np.abs(_next_row(apart) - reference).max() < 1e-4
        with _Unified(model, n_ctx=256, n_seq=2) as pooled:
            assert np.abs(_next_row(pooled) - reference).max() > 0.05
