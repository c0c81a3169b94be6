"""What the one KV pool the slots of `serve --parallel` share does to a sequence's logits (DESIGN §8, "One pool"):
nothing is misplaced — the rounding follows the order of the cells. CPU attention sums over a sequence's cells in
cell order (flash attention accumulates V in 16-bit floats cell by cell; without it the dot products group cells by
their index), so the same cells in another order round differently. With flash attention on (llama.cpp's `auto`,
which the pool keeps), cells of several sequences interleaved change nothing, and a sequence's next cell landing in a
hole before its own cells moves its logits by tenths on SmolLM2 Q4_1; with it off, the hole changes nothing and the
interleaving — the normal state of a shared batch — moves them as much. Flash attention on against off alone moves
them by 0.35 there: none of these is more right than another; what moves is bit-for-bit repeatability."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.llama.context import Context
from localspec.llama.model import Model

A = [5 + (7 * i) % 190 for i in range(48)]
B = [9 + (11 * i) % 180 for i in range(44)]


def _context(model: Model, flash: bool, n_seq: int) -> Context:
    class _Flash(Context):
        def _configure(self, params) -> None:
            params.flash_attn_type = 1 if flash else 0

    return _Flash(model, n_ctx=256, n_seq=n_seq)


def _alone(model: Model, flash: bool, chunk: int) -> np.ndarray:
    """B's next row after B[:42] read `chunk` tokens a decode, in a context of its own."""
    with _context(model, flash, 1) as ctx:
        for start in range(0, 42, chunk):
            ctx.decode(B[start : min(42, start + chunk)], start, outputs=0)
        ctx.decode(B[42:43], 42, outputs=1)
        return ctx.logits(-1).copy()


def _after_a_hole(model: Model, flash: bool) -> np.ndarray:
    """The same row in a pool where sequence 0's cells come first and its tail is dropped: the row lands in the hole,
    before sequence 1's own cells."""
    with _context(model, flash, 2) as ctx:
        ctx.decode(A, 0, outputs=0, seq=0)
        ctx.decode(B[:42], 0, outputs=0, seq=1)
        ctx.remove_from(40, 0)
        ctx.decode(B[42:43], 42, outputs=1, seq=1)
        return ctx.logits(-1).copy()


def _interleaved(model: Model, flash: bool) -> np.ndarray:
    """The same row in a pool where both sequences were read 6 tokens a turn: their cells alternate, each in order."""
    with _context(model, flash, 2) as ctx:
        for start in range(0, 42, 6):
            ctx.decode(A[start : start + 6], start, outputs=0, seq=0)
            ctx.decode(B[start : start + 6], start, outputs=0, seq=1)
        ctx.decode(B[42:43], 42, outputs=1, seq=1)
        return ctx.logits(-1).copy()


@pytest.mark.slow
def test_the_pool_rounds_by_the_order_of_a_sequences_cells_not_by_misplacing_them(smollm2_path):
    with Model(smollm2_path) as model:
        on_alone, off_alone = _alone(model, True, 42), _alone(model, False, 42)
        on_hole, off_hole = _after_a_hole(model, True), _after_a_hole(model, False)
        assert (off_hole == off_alone).all()  # flash attention off: the hole changes no bit
        assert 0.1 < np.abs(on_hole - on_alone).max() < 1.5  # on (the pool's): tenths (0.55, 2026-12-07)
        on_mixed, off_mixed = _interleaved(model, True), _interleaved(model, False)
        on_alone6, off_alone6 = _alone(model, True, 6), _alone(model, False, 6)
        assert (on_mixed == on_alone6).all()  # on: interleaved cells change no bit
        assert 0.1 < np.abs(off_mixed - off_alone6).max() < 1.5  # off: tenths (0.38)
        assert 0.1 < np.abs(on_alone - off_alone).max() < 1.5  # on against off, one sequence alone (0.35)
